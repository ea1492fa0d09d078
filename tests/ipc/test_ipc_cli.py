"""The client's timeouts and the ``edge`` CLI against an in-process server."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from edge import cli
from edge.errors import ErrorCode, FlowError
from support.ipc_fakes import FakeEngine, FakeTokenizer, expected_embedding


def run_cli(capsys, *argv) -> tuple[int, dict | None, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else None), err


def test_embed_prints_one_json_line_per_text(make_server, capsys):
    server = make_server()
    assert cli.main(["embed", "hello world", "x y z", "--connect", server.address]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["index"] for line in lines] == [0, 1] and [line["tokens"] for line in lines] == [4, 5]
    assert np.allclose(lines[1]["embedding"], expected_embedding(FakeTokenizer().encode("x y z").ids), atol=1e-6)
    assert lines[0]["trace_id"] == lines[1]["trace_id"] and lines[0]["truncated"] is False


def test_embed_health_stats(make_server, capsys):
    server = make_server()
    rc, out, _ = run_cli(capsys, "embed", "hello world", "x y z", "--connect", server.address, "--priority", "0",
                         "--format", "reply")
    assert rc == 0 and out["count"] == 2 and out["buckets"] == [8, 8]
    assert np.allclose(out["embeddings"][1], expected_embedding(FakeTokenizer().encode("x y z").ids), atol=1e-6)
    rc, out, _ = run_cli(capsys, "embed", "a " * 100, "--no-truncate", "--connect", server.address)
    assert rc == 1 and out["error"]["code"] == ErrorCode.TOO_MANY_TOKENS and len(out["error"]["trace_id"]) == 16
    rc, out, _ = run_cli(capsys, "embed", "a", "--priority", "7", "--connect", server.address)
    assert rc == 1 and out["error"]["name"] == "INVALID_OPTION"
    rc, out, _ = run_cli(capsys, "health", "--connect", server.address)
    assert rc == 0 and out["ready"] is True
    rc, out, _ = run_cli(capsys, "stats", "--connect", server.address)
    assert rc == 0 and out["replies_ok"]["infer"] == 1 and out["lineage"]["package_sha256"] == "p" * 64


def test_health_exit_codes(make_server, capsys, sock_dir):
    server = make_server(start=False)
    server.bind()
    server.start(ready=False)
    rc, out, _ = run_cli(capsys, "health", "--connect", server.address)
    assert rc == 1 and out["ready"] is False and out["live"] is True
    rc, out, err = run_cli(capsys, "health", "--connect", f"ipc://{sock_dir}/absent.sock", "--timeout", "0.2")
    assert rc == 2 and out is None and "socket file does not exist" in err  # said at once, not after the timeout
    rc, out, err = run_cli(capsys, "health", "--connect", "tcp://127.0.0.1:9", "--timeout", "0.2")
    assert rc == 2 and out is None and "no reply from tcp://127.0.0.1:9 within 0.2 s" in err


def test_serve_execs_the_device_command_line(monkeypatch):
    """`edge serve` becomes `python -S -m edge.boot ARGS` (the bundle's command), with the module path set."""
    import os

    from edge.runtime.launch import boot_argv, boot_pythonpath

    seen = []
    monkeypatch.setattr(os, "execve", lambda path, argv, env: seen.append((path, argv, env)))
    assert cli.main(["serve", "--package", "/p", "--engine", "onnxruntime"]) == 0
    (path, argv, env), = seen
    assert path == sys.executable and argv == [*boot_argv(), "--package", "/p", "--engine", "onnxruntime"]
    assert env["PYTHONPATH"].split(os.pathsep)[: len(boot_pythonpath())] == boot_pythonpath()
    # the runtime's timeline starts at this exec, not at the start of `edge serve` (a build may precede it)
    import time

    assert 0 <= time.clock_gettime_ns(time.CLOCK_BOOTTIME) - int(env["EDGE_EXEC_BOOTTIME_NS"]) < 5e9


def test_serve_refuses_bad_flags_before_any_build(monkeypatch, capsys):
    monkeypatch.setattr("edge.runtime.default_package.ensure_default_package", lambda p: pytest.fail("built a package"))
    with pytest.raises(SystemExit) as ei:
        cli.main(["serve", "--engine", "nope"])
    assert ei.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_client_timeout_resets_connection(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine)
    c = make_client(server)
    engine.release.clear()
    with pytest.raises(TimeoutError):
        c.embed(["slow one"], timeout_s=0.2)
    engine.release.set()
    # the late reply to "slow one" went to the old connection; this one gets its own answer
    r = c.embed(["fresh"])
    assert np.allclose(r.embeddings[0], expected_embedding(FakeTokenizer().encode("fresh").ids), atol=1e-6)


def test_client_raises_typed_errors(make_server, make_client):
    engine = FakeEngine()
    server = make_server(engine)
    busy, c = make_client(server), make_client(server)
    engine.release.clear()
    busy.send("infer", {"texts": ["keeps the server draining"]})
    assert engine.running.wait(5)
    server.request_drain()
    with pytest.raises(FlowError) as ei:
        c.embed("x", request_id="late")
    assert ei.value.code == ErrorCode.SHUTTING_DOWN and ei.value.recoverable
    assert ei.value.request_id == "late"
    engine.release.set()
    assert busy.recv(5).type == "infer"
