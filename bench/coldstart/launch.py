"""Start one process (runtime, bundle, baseline) and time exec to its first correct reply.

The clock: CLOCK_BOOTTIME in ns taken just before ``Popen`` (exec), passed to the child as
``EDGE_EXEC_BOOTTIME_NS`` so the runtime's timeline ("ms since exec") and ours share one
origin; the end is when the reply has been decoded and its embedding matched the reference
(cosine >= :data:`MIN_COSINE`).

The client is deliberately lean (pyzmq + msgpack, no numpy, no ``edge`` import): a live
process keeps the pages it maps resident, so whatever the benchmark itself maps stays warm
in a cold-cache run. It connects right after the exec, before the runtime has bound (a
ZeroMQ ipc connect retries every ``RECONNECT_IVL``), and queues its request at once.
"""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import zmq

from edge.launch import boot_argv, boot_env

__all__ = ["MIN_COSINE", "RunFailed", "RunResult", "cosine", "decode_f32le", "run_runtime", "run_bundle",
           "run_baseline", "run_import_probe", "BASELINE_SCRIPT"]

MIN_COSINE = 0.9999
RECONNECT_IVL_MS = 5  # connect retry period while the runtime has not bound yet
POLL_MS = 20  # how often we look whether the child died while waiting (a reply ends the wait at once)
STOP_TIMEOUT_S = 20.0
NOT_READY = "NOT_READY"  # error name of a request that reached a server still booting (docs/protocol.md)
RETRY_S = 0.002  # pause before asking again after NOT_READY
HERE = Path(__file__).resolve().parent
BASELINE_SCRIPT = HERE / "baseline.py"


class RunFailed(RuntimeError):
    """A run that gave no correct reply; the message says why (with the child's log tail)."""


@dataclass
class RunResult:
    kind: str  # "runtime" | "bundle" | "baseline" | "import_probe"
    total_ms: float  # exec to first correct reply (ms)
    phases: dict = field(default_factory=dict)  # name -> [start_ms, end_ms] since our exec
    timeline: dict | None = None  # the runtime's own boot timeline (from `stats`)
    reply: dict = field(default_factory=dict)  # reply metadata (engine, hashes, buckets, ...)
    cosine: float | None = None
    pid: int | None = None
    mapped_files: list[str] = field(default_factory=list)  # /proc/PID/maps while serving (runtime only)
    listed_files: list[str] = field(default_factory=list)  # files a --list-files child reported
    embedding_b64: str | None = None  # the baseline's embedding (float32 LE, base64): the reference

    def as_dict(self) -> dict:
        d = {"kind": self.kind, "total_ms": round(self.total_ms, 3), "phases": self.phases,
             "cosine": self.cosine, "pid": self.pid}
        if self.timeline is not None:
            d["timeline"] = self.timeline
        if self.reply:
            d["reply"] = self.reply
        return d


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def decode_f32le(buf: bytes) -> array:
    a = array("f")
    a.frombytes(buf)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def cosine(a, b) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


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


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Client:
    """One DEALER socket with a short reconnect interval; msgpack frames per docs/protocol.md."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        self.sock.setsockopt(zmq.RECONNECT_IVL_MAX, 0)  # no back-off: keep retrying every 5 ms
        self.sock.connect(address)

    def send(self, mtype: str, body: dict) -> None:
        # With ZMQ_IMMEDIATE off (the default) the message waits in the pipe until the peer exists.
        self.sock.send_multipart([msgpack.packb({"v": 1, "type": mtype}), msgpack.packb(body)])

    def wait(self, proc: subprocess.Popen | None, deadline_ns: int, log: Path | None) -> tuple[dict, dict, list]:
        while True:
            if self.sock.poll(POLL_MS, zmq.POLLIN):
                frames = self.sock.recv_multipart()
                return msgpack.unpackb(frames[0]), msgpack.unpackb(frames[1]), frames[2:]
            if proc is not None and proc.poll() is not None:
                raise RunFailed(f"process exited {proc.returncode} before replying:\n{_tail(log) if log else ''}")
            if now_ns() > deadline_ns:
                raise RunFailed(f"no reply within the timeout:\n{_tail(log) if log else ''}")

    def request(self, mtype: str, body: dict, timeout_s: float = 10.0) -> dict:
        self.send(mtype, body)
        header, body, _ = self.wait(None, now_ns() + int(timeout_s * 1e9), None)
        if header.get("type") == "error":
            raise RunFailed(f"{mtype} answered with an error: {body}")
        return body

    def close(self) -> None:
        self.sock.close(0)


def _embed_and_check(client: _Client, proc, text: str, reference, deadline_ns: int, log: Path) -> tuple[int, dict, float]:
    """Send one infer, wait for the reply, check it; returns (end_ns, reply body, cosine).

    A server that has started its loop but not yet switched to ready answers ``NOT_READY``
    (recoverable): like any client we ask again, and the clock runs on. Any other error, or a
    wrong embedding, fails the run.
    """
    retries = 0
    while True:
        client.send("infer", {"texts": [text], "request_id": 1 + retries})
        header, body, extra = client.wait(proc, deadline_ns, log)
        if header.get("type") == "error" and body.get("name") == NOT_READY and now_ns() < deadline_ns:
            retries += 1
            time.sleep(RETRY_S)
            continue
        break
    if header.get("type") == "error":
        raise RunFailed(f"first reply is an error: {body}\n{_tail(log)}")
    body = {**body, "not_ready_retries": retries}
    if len(extra) != 1 or body.get("count") != 1:
        raise RunFailed(f"infer reply has {len(extra)} embedding frames, count {body.get('count')}")
    emb = decode_f32le(extra[0])
    cos = cosine(emb, reference)
    end = now_ns()
    if not cos >= MIN_COSINE:
        raise RunFailed(f"first reply is wrong: cosine {cos:.6f} to the reference < {MIN_COSINE}")
    return end, body, cos


def _ms(ns: int, origin_ns: int) -> float:
    return round((ns - origin_ns) / 1e6, 3)


def _clean_env(extra: dict) -> dict:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)  # never tell our own service manager that the runtime is ready
    env.update(extra)
    return env


def run_runtime(package: Path, engine: str, workdir: Path, text: str, reference, *, timeout_s: float = 120.0,
                extra_args: list[str] = ()) -> RunResult:
    """``python -m edge.boot`` as a process; exec to first correct reply, plus its timeline."""
    workdir.mkdir(parents=True, exist_ok=True)
    address = f"ipc://{workdir}/edge.sock"
    log = workdir / "runtime.log"
    args = ["--package", str(package), "--engine", engine, "--bind", address,
            "--timeline", str(workdir / "timeline.json"), *extra_args]
    cmd = [*boot_argv(), *args]  # as the bundle starts it: python -S, explicit PYTHONPATH
    with open(log, "wb") as out:
        t0 = now_ns()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                env=boot_env(_clean_env({"EDGE_EXEC_BOOTTIME_NS": str(t0)})))
    client = _Client(address)
    try:
        end, body, cos = _embed_and_check(client, proc, text, reference, t0 + int(timeout_s * 1e9), log)
        # Untimed from here on.
        mapped = _mapped_files(proc.pid)
        timeline = client.request("stats", {}).get("timeline")
    finally:
        client.close()
        _stop(proc)
    return _runtime_result("runtime", end - t0, timeline, body, cos, proc.pid, mapped)


def _runtime_result(kind, total_ns, timeline, body, cos, pid, mapped, offset_ms: float = 0.0) -> RunResult:
    total_ms = total_ns / 1e6
    phases = {}
    if isinstance(timeline, dict):
        for s in timeline.get("stages") or []:
            phases[s["stage"]] = [round(s["start_ms"] + offset_ms, 3), round(s["end_ms"] + offset_ms, 3)]
        if "interpreter" in phases and len(phases) > 1:
            # edge.boot's own module-level imports, between the interpreter and its first stage.
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


def prepare_socket_dir(bundle: Path, meta: dict) -> None:
    """Create the host socket directory when missing (systemd's RuntimeDirectory does it in service),
    owned by the container's user so the runtime can bind there; mode 0750 as the protocol says."""
    sock_dir = Path(meta["socket_dir"])
    if sock_dir.is_dir():
        return
    sock_dir.mkdir(parents=True, mode=0o750)
    try:
        user = json.loads((bundle / "config.json").read_text())["process"].get("user") or {}
        os.chown(sock_dir, int(user.get("uid", 0)), int(user.get("gid", 0)))
    except (OSError, ValueError, KeyError):
        pass


def check_address_free(address: str) -> None:
    """Refuse to measure while another runtime (e.g. the installed service) answers on ``address``."""
    client = _Client(address)
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
                                stdout=out, stderr=subprocess.STDOUT, env=_clean_env({}))
    client = _Client(address)
    try:
        end, body, cos = _embed_and_check(client, proc, text, reference, t0 + int(timeout_s * 1e9), log)
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
        subprocess.run([runc_bin, "kill", cid, "TERM"], capture_output=True)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            subprocess.run([runc_bin, "kill", cid, "KILL"], capture_output=True)
            proc.wait()
        subprocess.run([runc_bin, "delete", "-f", cid], capture_output=True)
    result = _runtime_result("bundle", end - t0, timeline, body, cos, proc.pid, mapped, offset_ms)
    result.phases["container_start"] = [0.0, round(offset_ms, 3)]
    # The runtime's "interpreter" stage starts at its own origin; ours is runc's exec.
    return result


# ----------------------------------------------------------------- baseline and probes


def _run_script(kind: str, args: list[str], reference, timeout_s: float, list_files: bool, workdir: Path) -> RunResult:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{kind}.log"
    cmd = [sys.executable, str(BASELINE_SCRIPT), *args, *(["--list-files"] if list_files else [])]
    env = _clean_env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    with open(log, "wb") as err:
        t0 = now_ns()
        env["EDGE_EXEC_BOOTTIME_NS"] = str(t0)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, cwd=workdir, env=env)
    try:
        line = _read_line(proc, t0 + int(timeout_s * 1e9))
        if not line:
            proc.wait(STOP_TIMEOUT_S)
            raise RunFailed(f"{kind} exited {proc.returncode} without a result:\n{_tail(log)}")
        record = json.loads(line)
        cos = None
        if "embedding_f32le_b64" in record:
            emb = decode_f32le(base64.b64decode(record["embedding_f32le_b64"]))
            cos = cosine(emb, reference) if reference is not None else 1.0
        end = now_ns()
        if cos is not None and not cos >= MIN_COSINE:
            raise RunFailed(f"{kind} result is wrong: cosine {cos:.6f} to the reference")
        listed = json.loads(proc.stdout.readline() or "{}").get("files", []) if list_files else []
        proc.wait(STOP_TIMEOUT_S)  # untimed: interpreter teardown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    phases = dict(record.get("phases", {}))
    phases["result_to_reply"] = [phases[list(phases)[-1]][1], round((end - t0) / 1e6, 3)] if phases else None
    return RunResult(kind, (end - t0) / 1e6, phases, None, {}, cos, record.get("pid"), [], listed,
                     record.get("embedding_f32le_b64"))


def _read_line(proc: subprocess.Popen, deadline_ns: int) -> bytes:
    """The child's first stdout line, or b"" when it exits or the deadline passes."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    fd = proc.stdout.fileno()
    try:
        while b"\n" not in buf:
            left = (deadline_ns - now_ns()) / 1e9
            if left <= 0:
                return b""
            if sel.select(min(left, 1.0)):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b""
                buf += chunk
    finally:
        sel.close()
    line, rest = buf.split(b"\n", 1)
    if rest:  # the --list-files line may already be here: put it back in front of the stream
        proc.stdout = _Prefixed(rest, proc.stdout)
    return line


class _Prefixed:
    def __init__(self, head: bytes, stream) -> None:
        self._head, self._stream = head, stream

    def readline(self) -> bytes:
        if b"\n" in self._head:
            line, self._head = self._head.split(b"\n", 1)
            return line + b"\n"
        line, self._head = self._head + self._stream.readline(), b""
        return line

    def close(self) -> None:
        self._stream.close()


def run_baseline(model_dir: Path, text: str, reference, workdir: Path, *, timeout_s: float = 300.0,
                 list_files: bool = False) -> RunResult:
    """sentence-transformers in a fresh process: import, load safetensors + tokenizer.json, encode."""
    return _run_script("baseline", [str(model_dir), text], reference, timeout_s, list_files, workdir)


def run_import_probe(module: str, workdir: Path, *, timeout_s: float = 300.0, list_files: bool = False) -> RunResult:
    """A fresh process that only imports ``module``: exec to import done."""
    return _run_script(f"import_{module}", ["--import-only", module], None, timeout_s, list_files, workdir)
