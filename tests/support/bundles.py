"""Helpers of the bundle tests (tests/bundle, and the cold-start, fleet and trial tests that run
bundles): runc containers, the plain runtime, the socket directory, the cached bundle."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from edge.system.readiness import NotifiedProcess, NotReady, stop_process  # noqa: F401 - stop_process: for the tests

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "bundle" / "fixtures"
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


def _has_cap_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)  # CAP_SYS_RESOURCE = 24
    return False


def host_nofile(wanted: int) -> int:
    """The RLIMIT_NOFILE runc can give a container here: ``wanted``, unless it is above this
    process's hard limit and root lacks CAP_SYS_RESOURCE (a build host where root
    cannot raise its hard limit of 20,000: runc would fail with "error setting rlimit type 7")."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or wanted <= hard or _has_cap_sys_resource():
        return wanted
    return hard


def supervisor_events(log: str, name: str | None = None) -> list[dict]:
    """edge-supervise's log lines (JSON, ``source`` edge-supervise) in ``log``, those of event ``name``."""
    found = []
    for line in log.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("source") == "edge-supervise":
            if name is None or record.get("event") == name:
                found.append(record)
    return found


def runnable_bundle(bundle: Path, workdir: Path) -> Path:
    """``bundle``, or where this host cannot grant its RLIMIT_NOFILE, a directory in ``workdir``
    with a copy of its config.json (that limit lowered to :func:`host_nofile`, paths made absolute)
    and of its metadata. The bundle stays untouched. For tests that run runc themselves:
    edge-supervise caps the limit on its own (its ``supervise.nofile_capped``), so the tests of
    the supervisor and the unit give it the bundle as built."""
    config = json.loads((bundle / "config.json").read_text())
    rlimits = config["process"]["rlimits"]
    nofile = next(r for r in rlimits if r["type"] == "RLIMIT_NOFILE")
    allowed = host_nofile(nofile["hard"])
    if allowed == nofile["hard"]:
        return bundle
    nofile["hard"] = nofile["soft"] = allowed
    config["root"]["path"] = str(bundle.resolve() / config["root"]["path"])
    for m in config["mounts"]:  # binds of the rootfs's under-tmp copies name it relative to the bundle
        if m["type"] == "bind" and not os.path.isabs(m["source"]):
            m["source"] = str(bundle.resolve() / m["source"])
    out = workdir / f"host-bundle-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    shutil.copyfile(bundle / "edge-bundle.json", out / "edge-bundle.json")
    return out


def bundle_key(package: Path) -> str:
    from edge.system.version import git_commit

    # The commit too: the bundle's lineage names it (image/bundle/wheel.py), whatever the files.
    h = hashlib.sha256(f"{package.resolve()};{sys.executable};{sys.version};{git_commit(str(REPO))}".encode())
    for pattern in _CODE:
        for p in sorted(REPO.glob(pattern)):
            h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes())
    h.update((package / "manifest.json").read_bytes())
    return h.hexdigest()[:24]


def cached_bundle(package: Path, variant: str, build):
    """The bundle of ``package`` that ``build(out, socket_dir, state_dir)`` writes, built once and
    cached by its inputs (:func:`bundle_key`) in .cache/bundles/KEY[-VARIANT]; read-only for tests.
    A generator: its lock is held shared while the session uses it, so another session's prune
    (tests/conftest.py) skips it."""
    cache = REPO / ".cache" / "bundles"
    cache.mkdir(parents=True, exist_ok=True)
    key = bundle_key(package) + (f"-{variant}" if variant else "")
    out = cache / key / "bundle"
    with open(cache / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "edge-bundle.json").exists():
            build(out, cache / key / "run", cache / key / "state")  # the state directory: not the host's /var/lib
            assert (out / "edge-bundle.json").exists(), f"{out}: the build wrote no bundle"
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield out


def bundle_meta(bundle: Path) -> dict:
    return json.loads((bundle / "edge-bundle.json").read_text())


def prepare_socket_dir(meta: dict) -> Path:
    """What edge-supervise does on the device (edge/system/socket_dir.py): the socket directory and the
    state directory, the runtime's user's."""
    from edge.system.socket_dir import ipc_socket_name, prepare_host_dirs
    from edge.system.socket_dir import prepare_socket_dir as prepare

    uid, gid = meta["user"]["uid"], meta["user"]["gid"]
    prepare(meta["socket_dir"], uid, gid, socket_name=ipc_socket_name(meta.get("address")))
    prepare_host_dirs(uid, gid, meta.get("metrics_dir"), meta.get("state_dir"))
    return Path(meta["socket_dir"])


class Container(NotifiedProcess):
    """``runc run --bundle BUNDLE ID`` (in a session of its own), output in ``WORKDIR/ID.log``.

    Stopping sends ``runc kill ID TERM`` (the drain path), then ``runc kill ID KILL``; the
    container is always deleted.
    """

    def __init__(self, bundle: Path, workdir: Path, runc: str, prefix: str) -> None:
        self.runc = runc
        self.bundle = bundle  # the directory runc runs (its config.json is what the container got)
        self.id = f"{prefix}-{uuid.uuid4().hex[:10]}"
        super().__init__([runc, "run", "--bundle", str(bundle), self.id], notify_path=workdir / "notify.sock",
                         log_path=workdir / f"{self.id}.log", new_session=True,
                         terminate=lambda _proc: self._runc("kill", self.id, "TERM"), kill=self._kill_all)

    def _runc(self, *args: str, timeout: float = 10) -> subprocess.CompletedProcess:
        return subprocess.run([self.runc, *args], capture_output=True, timeout=timeout)

    def _kill_all(self, proc: subprocess.Popen) -> None:
        self._runc("kill", self.id, "KILL")
        proc.kill()  # runc run itself, should it wait for a dead init

    def output(self, tail: int | None = None) -> str:
        return super().output(tail)

    def wait_ready(self, deadline_s: float = READY_DEADLINE_S) -> float:
        """Seconds from start to READY=1; an AssertionError with the output if it never comes."""
        try:
            return super().wait_ready(deadline_s)
        except NotReady as exc:
            raise AssertionError(f"runc run {exc}") from None

    def exec(self, *cmd: str, user: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        args = [self.runc, "exec", *(["--user", user] if user else []), self.id, *cmd]
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (the drain path), then whatever it takes; the container is always deleted."""
        try:
            return super().stop(timeout_s)
        finally:
            self._runc("delete", "--force", self.id, timeout=30)


def start_container(bundle: Path, workdir: Path, prefix: str = "edge-test") -> Container:
    """``runc run --bundle`` with a NOTIFY_SOCKET the test listens on; does not wait.
    ``bundle``'s open-files limit is lowered where this host cannot grant it (:func:`runnable_bundle`)."""
    runc = runc_or_skip()
    workdir.mkdir(parents=True, exist_ok=True)
    return Container(runnable_bundle(bundle, workdir), workdir, runc, prefix)


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


def private_bundle(bundle: Path, workdir: Path) -> Path:
    """A bundle of its own in ``workdir``, sharing ``bundle``'s rootfs and leaving it untouched: a
    copy of its config.json (the open-files limit lowered as in :func:`runnable_bundle`, paths made
    absolute, the socket directory moved to ``workdir/run``) and of its metadata (``socket_dir``
    and ``address`` to match). For tests that write beside a bundle (its ``.snapshot``) or must not
    share the cached bundle's socket directory with other tests."""
    config = json.loads((bundle / "config.json").read_text())
    for r in config["process"]["rlimits"]:
        if r["type"] == "RLIMIT_NOFILE":
            r["hard"] = r["soft"] = host_nofile(r["hard"])
    config["root"]["path"] = str(bundle.resolve() / config["root"]["path"])
    sockets = workdir / "run"
    for m in config["mounts"]:
        if m["destination"] == "/run/edge":
            m["source"] = str(sockets)
        elif m["type"] == "bind" and not os.path.isabs(m["source"]):
            m["source"] = str(bundle.resolve() / m["source"])
    env = config["process"]["env"]
    env[:] = [f"EDGE_BUNDLE_SOCKET_DIR={sockets}" if e.startswith("EDGE_BUNDLE_SOCKET_DIR=") else e for e in env]
    address = f"ipc://{sockets}/edge.sock"
    assert len(address) - len("ipc://") < 108, f"{address}: too long for a unix socket"
    out = workdir / f"bundle-{uuid.uuid4().hex[:8]}"
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    meta = bundle_meta(bundle)
    meta.update(socket_dir=str(sockets), address=address)
    (out / "edge-bundle.json").write_text(json.dumps(meta))
    return out


def criu_or_skip() -> str:
    """The criu runc will run (the first on PATH), when it is 4.1 or newer."""
    criu = shutil.which("criu")
    if criu is None:
        pytest.skip("criu is not installed (image/criu/build.sh installs CRIU 4.1.1)")
    out = subprocess.run([criu, "--version"], capture_output=True, text=True).stdout
    version = tuple(int(x) for x in out.split("Version:")[-1].strip().split(".")[:2] if x.isdigit())
    if version < (4, 1):
        pytest.skip(f"{criu} is {out.strip()!r}; snapshots need CRIU >= 4.1 (image/criu/build.sh)")
    return criu
