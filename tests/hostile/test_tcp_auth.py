"""TCP is authenticated with ZeroMQ CURVE (edge/ipc/curve.py, `edge keys generate`, `edge serve --keys`).

A local user, or the network, must get nothing from a tcp:// server started with keys unless
its client key is authorised; a bind other machines can reach is refused without keys.

* unit: the command lines (refusals, exit 2), the key layout and modes, key-file errors, and
  an in-process IpcServer (fake engine) that serves an authorised client and nobody else;
* process: the real runtime (`python -m edge.boot`, the MiniLM package) on tcp://127.0.0.1
  with --keys, one process for the module, and `edge embed` as a real client.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zmq

from edge.errors import BootError
from edge.ipc.client import EdgeClient
from edge.ipc.curve import ClientCurve, KeyFileError, ServerCurve, client_curve, is_loopback
from edge.ipc.server import IpcServer
from edge.commands.keys import KeysError, generate
from edge.serving.core import ServingCore
from edge.runtime.serve_args import parse_serve_args

REFUSED_S = 0.5  # how long a refused client waits for the reply that never comes (s)
EDGE = [sys.executable, "-m", "edge.cli"]


def _keys(root: Path) -> dict[str, Path]:
    """A server key directory with client "app" authorised, and "mallory", a pair it never saw."""
    generate(str(root / "keys"), client="app")
    generate(str(root / "other"), client="mallory")
    return {"dir": root / "keys", "server": root / "keys/server.key",
            "app": root / "keys/clients/app.key_secret", "mallory": root / "other/clients/mallory.key_secret",
            "other_server": root / "other/server.key"}


# ------------------------------------------------------------------ command lines


@pytest.mark.parametrize("argv, env", [
    (["--bind", "tcp://0.0.0.0:5555"], {}),
    (["--bind", "*:5555"], {}),
    ([], {"EDGE_ADDRESS": "tcp://0.0.0.0:5555"}),
])
def test_a_bind_others_can_reach_needs_keys(argv, env, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(argv, env=env)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "edge keys generate --out DIR" in err and "--keys DIR" in err and "Traceback" not in err


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:5555", "tcp://127.9.8.7:1", "localhost:5555"])
def test_loopback_without_keys_is_allowed(address):
    assert parse_serve_args(["--bind", address], env={}).keys is None


def test_keys_with_ipc_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["--bind", f"ipc://{tmp_path}/s.sock", "--keys", str(tmp_path)], env={})
    assert exc.value.code == 2 and "argument --keys: keys are for a tcp:// --bind" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_serve_args([], env={"EDGE_KEYS": str(tmp_path)})  # the default address: ipc
    assert "EDGE_KEYS: keys are for a tcp://" in capsys.readouterr().err
    args = parse_serve_args(["--bind", "tcp://0.0.0.0:5555"], env={"EDGE_KEYS": str(tmp_path)})
    assert args.keys == str(tmp_path)


@pytest.mark.parametrize("address, loopback", [
    ("tcp://127.0.0.1:1", True), ("tcp://127.255.0.1:1", True), ("tcp://[::1]:1", True), ("tcp://localhost:1", True),
    ("tcp://0.0.0.0:1", False), ("tcp://*:1", False), ("tcp://10.0.0.1:1", False), ("tcp://eth0:1", False),
    ("tcp://[::]:1", False), ("tcp://localhost.example:1", False), ("ipc:///tmp/x", False),
])
def test_is_loopback(address, loopback):
    assert is_loopback(address) is loopback


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_generate_layout_and_modes(tmp_path):
    out = tmp_path / "keys"
    written = [p for p, _ in generate(str(out))]
    assert sorted(os.listdir(out)) == ["authorized_clients", "server.key", "server.key_secret"]
    assert written == [f"{out}/", f"{out}/authorized_clients/", f"{out}/server.key", f"{out}/server.key_secret"]
    assert os.listdir(out / "authorized_clients") == []
    generate(str(out), client="app")
    assert sorted(os.listdir(out / "clients")) == ["app.key", "app.key_secret"]
    assert os.listdir(out / "authorized_clients") == ["app.key"]
    modes = {p.relative_to(out).as_posix(): _mode(p) for p in out.rglob("*")}
    assert modes == {"server.key": 0o644, "server.key_secret": 0o600, "authorized_clients": 0o700,
                     "authorized_clients/app.key": 0o644, "clients": 0o700, "clients/app.key": 0o644,
                     "clients/app.key_secret": 0o600}
    assert _mode(out) == 0o700
    import zmq.auth

    public, secret = zmq.auth.load_certificate(out / "clients/app.key_secret")
    assert zmq.auth.load_certificate(out / "authorized_clients/app.key") == (public, None)
    assert len(public) == len(secret) == 40 and public != zmq.auth.load_certificate(out / "server.key")[0]


def test_generate_refuses_to_overwrite_unless_forced(tmp_path):
    out = tmp_path / "keys"
    generate(str(out), client="app")
    server, app = (out / "server.key").read_bytes(), (out / "clients/app.key_secret").read_bytes()
    with pytest.raises(KeysError, match=r"server\.key exists: refusing .* \(--force replaces it\)"):
        generate(str(out))
    with pytest.raises(KeysError, match=r"app\.key exists: refusing"):
        generate(str(out), client="app")
    assert (out / "server.key").read_bytes() == server and (out / "clients/app.key_secret").read_bytes() == app
    generate(str(out), client="app", force=True)  # the client's pair only
    assert (out / "server.key").read_bytes() == server and (out / "clients/app.key_secret").read_bytes() != app
    generate(str(out), force=True)
    assert (out / "server.key").read_bytes() != server
    assert _mode(out / "server.key_secret") == 0o600 and _mode(out / "clients/app.key_secret") == 0o600


@pytest.mark.parametrize("name", ["../x", ".hidden", "a/b", "", "x" * 65, "a b"])
def test_generate_refuses_odd_client_names(tmp_path, name):
    with pytest.raises(KeysError, match="--client"):
        generate(str(tmp_path / "keys"), client=name)
    assert not (tmp_path / "keys").exists()


def test_generate_refuses_a_directory_others_can_read(tmp_path):
    d = tmp_path / "shared"
    d.mkdir(mode=0o755)
    (d / "notes.txt").write_text("x")
    d.chmod(0o755)
    with pytest.raises(KeysError, match="open to other users"):
        generate(str(d))
    empty = tmp_path / "empty"
    empty.mkdir()
    empty.chmod(0o755)
    generate(str(empty))
    assert _mode(empty) == 0o700


def test_cli_keys_generate(tmp_path, capsys):
    from edge.cli import main

    out = tmp_path / "keys"
    assert main(["keys", "generate", "--out", str(out), "--client", "app"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}/server.key_secret" in text and f"wrote {out}/authorized_clients/app.key" in text
    assert f"edge serve --bind tcp://HOST:PORT --keys {out}" in text
    assert f"--server-key {out}/server.key --client-key {out}/clients/app.key_secret" in text
    assert main(["keys", "generate", "--out", str(out)]) == 2
    assert "refusing to replace" in capsys.readouterr().err


# ------------------------------------------------------------------ key files


def test_missing_or_bad_key_files_name_the_file(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    try:
        with pytest.raises(BootError, match=f"{tmp_path}/server.key_secret: no such file") as exc:
            ServerCurve(str(tmp_path)).apply(router, ctx)
        assert "--keys DIR" in exc.value.setting
        generate(str(tmp_path / "k"))
        (tmp_path / "k/authorized_clients/bad.key").write_text("not a certificate\n")
        with pytest.raises(BootError, match=r"authorised client key .*/bad\.key: no public-key line"):
            ServerCurve(str(tmp_path / "k")).apply(router, ctx)
        (tmp_path / "k/authorized_clients/bad.key").unlink()
        (tmp_path / "k/server.key_secret").write_text((tmp_path / "k/server.key").read_text())
        with pytest.raises(BootError, match=r"server\.key_secret: holds no secret key"):
            ServerCurve(str(tmp_path / "k")).apply(router, ctx)
    finally:
        router.close(0)
        ctx.term()


def test_client_keys_come_together_and_only_for_tcp(tmp_path):
    k = _keys(tmp_path)
    tcp = "tcp://127.0.0.1:9"
    assert client_curve(tcp, None, None, env={}) is None
    with pytest.raises(KeyFileError, match="--client-key is missing"):
        client_curve(tcp, str(k["server"]), None, env={})
    with pytest.raises(KeyFileError, match="EDGE_SERVER_KEY is missing"):
        client_curve(tcp, None, None, env={"EDGE_CLIENT_KEY": str(k["app"])})
    with pytest.raises(KeyFileError, match="keys are for tcp:// addresses"):
        client_curve(f"ipc://{tmp_path}/s.sock", str(k["server"]), str(k["app"]), env={})
    with pytest.raises(KeyFileError, match=r"--client-key: client key .*app\.key: holds no secret key"):
        client_curve(tcp, str(k["server"]), str(k["app"]).removesuffix("_secret"), env={})
    with pytest.raises(KeyFileError, match=r"EDGE_SERVER_KEY: server key .*/nope: no such file"):
        client_curve(tcp, None, None, env={"EDGE_SERVER_KEY": f"{tmp_path}/nope", "EDGE_CLIENT_KEY": str(k["app"])})
    curve = client_curve(tcp, None, None, env={"EDGE_SERVER_KEY": str(k["server"]), "EDGE_CLIENT_KEY": str(k["app"])})
    assert isinstance(curve, ClientCurve) and len(curve.server_public) == 40


# ------------------------------------------------------------------ in process: a fake engine


@pytest.fixture
def curve_server(tmp_path):
    from support.ipc_fakes import FakeEngine, FakeTokenizer

    k = _keys(tmp_path)
    server = IpcServer("tcp://127.0.0.1:0", ServingCore(FakeEngine(), FakeTokenizer(), max_seq_length=64),
                       curve=ServerCurve(str(k["dir"])))
    server.bind()
    server.start()
    try:
        yield server, k
    finally:
        server.request_drain()
        assert server.wait(10)
    assert server._curve._auth is None  # the ZAP handler stopped with the server


def test_in_process_only_authorised_clients_are_served(curve_server):
    server, k = curve_server
    for curve in (None, ClientCurve.load(str(k["server"]), str(k["mallory"])),
                  ClientCurve.load(str(k["other_server"]), str(k["app"]))):  # no keys, a stranger, a wrong server key
        with EdgeClient(server.address, timeout_s=REFUSED_S, curve=curve) as c, pytest.raises(TimeoutError):
            c.health()
    with EdgeClient(server.address, timeout_s=5, curve=ClientCurve.load(str(k["server"]), str(k["app"]))) as c:
        assert c.embed("x y").embeddings.shape == (1, 8)
        assert c.health()["ready"] is True
    assert server.metrics.snapshot()["requests"].get("health") == 1  # the refused ones never reached it


# ------------------------------------------------------------------ the real runtime


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def keyed_runtime(minilm_package, tmp_path_factory):
    """`python -m edge.boot` on tcp://127.0.0.1:PORT with --keys (debug log: the ZAP handler's verdicts)."""
    from support.runtime_proc import start_runtime

    root = tmp_path_factory.mktemp("tcp-auth")
    k = _keys(root)
    address = f"tcp://127.0.0.1:{_free_port()}"
    rt = start_runtime(root / "rt", "--package", str(minilm_package), "--engine", "onnxruntime",
                       "--bind", address, "--keys", str(k["dir"]), "--log-level", "debug")
    try:
        rt.wait_ready()
        yield address, k, rt
    finally:
        rt.stop()


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_")}
    return subprocess.run([*EDGE, *args], capture_output=True, text=True, timeout=60, env={**base, **(env or {})})


def test_runtime_serves_only_authorised_clients(keyed_runtime):
    address, k, rt = keyed_runtime
    with EdgeClient(address, timeout_s=REFUSED_S) as c, pytest.raises(TimeoutError):  # (a) no keys
        c.embed("hello")
    mallory = ClientCurve.load(str(k["server"]), str(k["mallory"]))
    with EdgeClient(address, timeout_s=REFUSED_S, curve=mallory) as c, pytest.raises(TimeoutError):  # (b) a stranger
        c.embed("hello")
    app = ClientCurve.load(str(k["server"]), str(k["app"]))
    with EdgeClient(address, timeout_s=30, curve=app) as c:  # (c) authorised, and the server is fine
        result = c.embed(["hello", "world"])
        assert result.embeddings.shape == (2, 384)
        np.testing.assert_allclose(np.linalg.norm(result.embeddings, axis=1), 1.0, rtol=1e-4)
        stats = c.stats()
    assert stats["requests"].get("infer") == 1 and stats["errors_total"] == 0  # nothing of (a), (b) got in
    log = rt.output(None)
    mallory_public = ClientCurve.load(str(k["server"]), str(k["mallory"])).public.decode()
    assert f"DENIED (CURVE) domain=* client_key=b'{mallory_public}'" in log
    assert '"event":"serve.curve"' in log and '"authorized_clients":1' in log
    assert "serve.tcp_unauthenticated" not in log


def test_cli_embed_with_keys(keyed_runtime):
    address, k, _ = keyed_runtime
    r = _cli("embed", "hello", "--connect", address, "--server-key", str(k["server"]), "--client-key", str(k["app"]))
    assert r.returncode == 0, r.stderr
    line = json.loads(r.stdout.splitlines()[0])
    assert len(line["embedding"]) == 384 and line["tokens"] == 3
    r = _cli("health", "--connect", address, env={"EDGE_SERVER_KEY": str(k["server"]),
                                                   "EDGE_CLIENT_KEY": str(k["app"])})
    assert r.returncode == 0 and json.loads(r.stdout)["ready"] is True, r.stderr
    r = _cli("health", "--connect", address, "--timeout", str(REFUSED_S))
    assert r.returncode == 2 and "a server started with --keys answers only clients with keys" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_server_key_is_a_boot_error(minilm_package, tmp_path):
    from support.runtime_proc import start_runtime

    (tmp_path / "empty").mkdir()
    rt = start_runtime(tmp_path / "rt", "--package", str(minilm_package), "--engine", "onnxruntime",
                       "--bind", f"tcp://127.0.0.1:{_free_port()}", "--keys", str(tmp_path / "empty"))
    try:
        assert rt.proc.wait(120) == 3
    finally:
        rt.stop()
    out = rt.output()
    assert f"boot stage 'bind' failed: [4030 BOOT_STAGE_FAILED] the server's key pair {tmp_path}/empty/" \
           f"server.key_secret: no such file" in out, out
    assert "--keys DIR" in out and "Traceback" not in out
