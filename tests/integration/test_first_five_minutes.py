"""A new user's mistakes with `edge`, as real processes: the exit code, a message naming the fix, no traceback."""

from __future__ import annotations

import json
import os
import pty
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import edge
from support.runtime_proc import start_runtime

EDGE = [sys.executable, "-m", "edge.cli"]


def run(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    for name in ("EDGE_ADDRESS", "EDGE_BIND"):  # each test says the address it means
        if name not in (env or {}):
            full_env.pop(name, None)
    return subprocess.run([*EDGE, *args], capture_output=True, text=True, timeout=timeout, env=full_env)


def assert_clean(r: subprocess.CompletedProcess, code: int, fix: str) -> None:
    """The three things every mistake must show: its exit code, the fix, no traceback."""
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert fix in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr


@pytest.mark.parametrize("args, env, fix", [
    (["embed", "hello", "--connect", "{tmp}/run/edge/edge.sock"], {}, "the socket file does not exist"),
    (["embed", "hello", "--connect", "ipc://{tmp}/nowhere.sock"], {}, "the socket file does not exist"),
    (["health"], {"EDGE_ADDRESS": "{tmp}/foo"}, "the socket file does not exist"),
    (["health", "--connect", "localhost:9", "--timeout", "0.3"], {}, "no reply from tcp://localhost:9 within 0.3 s"),
    (["health"], {"EDGE_ADDRESS": "localhost:99999"}, "EDGE_ADDRESS: 'localhost:99999': port '99999'"),
    (["embed", "x", "--connect", "http://example"], {}, "scheme 'http' is not served"),
    (["embed", "x", "--timeout", "-1"], {}, "give a number of seconds above 0"),
    (["serve", "--bind", "tcp://127.0.0.1:99999"], {}, "port '99999' is not a number in 0..65535"),
    (["serve", "--bind", "nosuchhost.invalid:80"], {}, "use 127.0.0.1 (this machine only)"),
    (["serve", "--engine", "tensorflow"], {}, "invalid choice: 'tensorflow'"),
    (["serve"], {"EDGE_ENGINE": "tensorflow"}, "EDGE_ENGINE='tensorflow': choose one of onnxruntime, torchscript"),
    (["serve"], {"EDGE_DRAIN_TIMEOUT_S": "soon"}, "'soon' is not a number (from the flag or EDGE_DRAIN_TIMEOUT_S)"),
    (["serve", "--package", "{tmp}/absent"], {}, "boot stage 'open_package' failed"),
])
def test_mistakes_exit_with_a_code_and_the_fix(args, env, fix, tmp_path):
    code = 3 if args[-1].endswith("absent") else 2
    fill = lambda s: s.replace("{tmp}", str(tmp_path))  # noqa: E731
    r = run(*map(fill, args), env={k: fill(v) for k, v in env.items()}, timeout=120)
    assert_clean(r, code, fix)


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"edge {edge.__version__}"


def test_no_build_extras_and_no_package_names_the_extra(tmp_path):
    """A device-style install (`pip install 'edge[onnxruntime]'`): no torch, so no default package."""
    hide = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda n, *a: None if n == 'torch' else real(n, *a); "
            "from edge.cli import main; sys.exit(main(['serve']))")
    r = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert_clean(r, 3, "pip install 'edge[serve]'")
    assert "--package DIR" in r.stderr and "missing: torch" in r.stderr
    assert not list(tmp_path.rglob("manifest.json"))


def _read_until(stream, needle: bytes, deadline_s: float) -> bytes:
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    seen, end = b"", time.monotonic() + deadline_s
    while needle not in seen and time.monotonic() < end:
        if sel.select(0.2):
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stopping_the_first_use_build_leaves_nothing_half_written(how, tmp_path):
    proc = subprocess.Popen([*EDGE, "serve", "--bind", f"ipc://{tmp_path}/run/edge.sock"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    try:
        head = _read_until(proc.stderr, b"building the default model package", 60)
        assert b"building the default model package" in head, head
        time.sleep(1.0)  # into the export: the builder is working, not starting up
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends: the whole foreground group
        else:
            proc.send_signal(signal.SIGTERM)  # what systemd or kill sends: our process only
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = head + err
    assert proc.returncode == (130 if how == "ctrl-c" else 143), err.decode()
    assert b"Traceback" not in err, err.decode()
    assert b"nothing was written" in err, err.decode()
    assert b"READY" not in out and b"boot.ready" not in out
    packages = tmp_path / "cache" / "edge" / "packages"
    left = [p.name for p in packages.iterdir() if not p.name.endswith(".lock")] if packages.exists() else []
    assert left == [], left  # neither the package nor a staging directory beside it


def test_a_bare_path_binds_ipc_and_a_terminal_gets_one_plain_line(minilm_package, tmp_path):
    """`--bind PATH` means ipc://PATH; at a terminal the server says ready, what and where, in one line."""
    sock = tmp_path / "run" / "x.sock"
    master, slave = pty.openpty()
    proc = subprocess.Popen([*EDGE, "serve", "--package", str(minilm_package), "--bind", str(sock)],
                            stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    try:
        with open(master, "rb", buffering=0, closefd=True) as tty:
            line = _read_until(tty, b"\n", 120)
        assert line.startswith(b"edge: ready in ") and f"on ipc://{sock}".encode() in line, line
        assert b"all-MiniLM-L6-v2" in line and b"onnxruntime/cpu" in line
        r = run("health", "--connect", str(sock))
        assert r.returncode == 0 and json.loads(r.stdout)["ready"] is True, r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_drain_like_sigterm(sig, minilm_package, tmp_path):
    rt = start_runtime(tmp_path, "--package", str(minilm_package))
    try:
        rt.wait_ready()
        sock = Path(rt.address[len("ipc://"):])
        assert sock.exists()
        rt.proc.send_signal(sig)
        assert rt.proc.wait(30) == 0, rt.output()
    finally:
        rt.stop()
    events = [json.loads(line)["event"] for line in rt.output().splitlines() if line.startswith("{")]
    assert events[-2:] == ["shutdown.draining", "shutdown.done"], events
    assert not sock.exists()  # the socket file goes with the server


def test_sigterm_while_booting_stops_without_announcing_ready(minilm_package, tmp_path):
    rt = start_runtime(tmp_path, "--package", str(minilm_package))
    maps = Path(f"/proc/{rt.proc.pid}/maps")
    try:
        # Inside the boot: the ONNX Runtime library is mapped by the import_engine stage, after the
        # signal handlers are set and a warm-up (hundreds of ms) before READY.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and rt.proc.poll() is None:
            try:
                if "libonnxruntime" in maps.read_text():
                    break
            except OSError:
                pass
            time.sleep(0.002)
        rt.proc.send_signal(signal.SIGTERM)
        assert rt.proc.wait(60) == 0, rt.output()
    finally:
        rt.stop()
    assert b"READY=1" not in rt.notify.fields(), rt.notices
    events = [json.loads(line)["event"] for line in rt.output().splitlines() if line.startswith("{")]
    assert "boot.ready" not in events and "shutdown.before_ready" in events, events
