"""Where the metrics go: the textfile (replaced atomically), the HTTP listener (loopback unless
told, bounded), the settings, and the boot's check for prometheus-client."""

from __future__ import annotations

import argparse
import os
import socket
import stat
import threading
import time
import urllib.error
import urllib.request

import pytest

from edge.observability.metrics import publish as MP
from edge.errors import BootError, ErrorCode
from edge.observability.metrics.export import registry_for, render
from edge.observability.metrics.publish import MetricsPublisher, check_metrics_export, write_textfile
from edge.config.argtypes import parse_listen
from edge.runtime.serve_args import parse_serve_args
from support.prometheus import promtool_check, samples, scrape_until, value

# ------------------------------------------------------------------ textfile


def test_textfile_is_replaced_never_rewritten_in_place(tmp_path):
    """A reader sees one whole version or the other, never part of one, nor a mix."""
    big = {c: (c * (4 << 20)).encode() + b"\n" for c in "ab"}  # 4 MiB: many write() calls each
    write_textfile(str(tmp_path), big["a"])
    seen, bad, stop = set(), [], threading.Event()

    def read() -> None:
        while not stop.is_set():
            data = (tmp_path / "edge.prom").read_bytes()
            seen.add(data[:1])
            if data not in big.values():
                bad.append(len(data))

    reader = threading.Thread(target=read)
    reader.start()
    inodes = set()
    try:
        for i in range(40):
            write_textfile(str(tmp_path), big["ab"[i % 2]])
            inodes.add(os.stat(tmp_path / "edge.prom").st_ino)
    finally:
        stop.set()
        reader.join()
    assert not bad, f"partial reads of {bad[:5]} bytes"
    assert seen == {b"a", b"b"} and len(inodes) > 1
    assert os.listdir(tmp_path) == ["edge.prom"]  # no temporary file left behind
    assert stat.S_IMODE(os.stat(tmp_path / "edge.prom").st_mode) == 0o644  # node_exporter runs as another user


def test_textfile_writes_on_start_every_interval_and_at_stop(fake_server, client, tmp_path):
    publisher = MetricsPublisher(registry_for(fake_server), textfile_dir=str(tmp_path), interval_s=0.05)
    publisher.start()
    path = tmp_path / "edge.prom"
    try:
        assert path.exists()  # written once before start() returns
        client(fake_server).embed(["a b c"])
        found = scrape_until(path.read_bytes, lambda f: value(f, "edge_replies_ok_total", type="infer") == 1)
        assert value(found, "edge_texts_accepted_total") == 1
        promtool_check(path.read_bytes())
    finally:
        fake_server.request_drain()
        assert fake_server.wait(10)
        publisher.stop()
    found = samples(path.read_bytes())  # the last write: after the drain
    assert value(found, "edge_state", state="stopped") == 1
    assert not publisher._writer.is_alive()


def test_a_failed_write_is_logged_once_and_serving_goes_on(fake_server, tmp_path, capsys):
    d = tmp_path / "gone"
    d.mkdir()
    publisher = MetricsPublisher(registry_for(fake_server), textfile_dir=str(d), interval_s=3600)
    d.rmdir()
    assert publisher.write() is False and publisher.write() is False
    out = capsys.readouterr().out
    assert out.count("metrics.write_failed") == 1
    d.mkdir()
    assert publisher.write() is True and "metrics.write_recovered" in capsys.readouterr().out


# ------------------------------------------------------------------ HTTP listener


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_listener_serves_metrics_only(fake_server, client):
    publisher = MetricsPublisher(registry_for(fake_server))
    publisher.start_listener("127.0.0.1", 0)
    try:
        host, port = publisher.address
        client(fake_server).embed(["x"])
        status, body = _get(f"http://{host}:{port}/metrics")
        assert status == 200 and b"# TYPE edge_requests_total counter" in body
        found = scrape_until(lambda: _get(f"http://{host}:{port}/metrics")[1],
                             lambda f: value(f, "edge_replies_ok_total", type="infer") == 1)
        assert value(found, "edge_requests_total", type="infer") == 1
        promtool_check(body)
        assert _get(f"http://{host}:{port}/other")[0] == 404
    finally:
        publisher.stop()
    with pytest.raises(OSError):  # closed at stop
        socket.create_connection((host, port), timeout=1).recv(1)


def test_listener_is_bounded_and_never_holds_up_serving(fake_server, client, monkeypatch):
    """Clients that connect and send nothing hold at most LISTEN_CLIENTS threads, each for
    LISTEN_TIMEOUT_S; one more is closed unanswered; the runtime serves all along."""
    monkeypatch.setattr(MP, "LISTEN_TIMEOUT_S", 0.5)
    publisher = MetricsPublisher(registry_for(fake_server))
    publisher.start_listener("127.0.0.1", 0)
    idle = []
    try:
        addr = publisher.address
        idle = [socket.create_connection(addr, timeout=5) for _ in range(MP.LISTEN_CLIENTS)]
        time.sleep(0.2)  # the listener has taken them all
        extra = socket.create_connection(addr, timeout=5)
        extra.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert extra.recv(100) == b""  # closed unanswered: no slot free
        extra.close()
        t0 = time.monotonic()
        assert client(fake_server).embed(["still serving"]).embeddings.shape == (1, 8)
        assert time.monotonic() - t0 < 0.5
        # the idle clients time out; their slots come back
        status, body = scrape_until_ok(f"http://{addr[0]}:{addr[1]}/metrics", timeout_s=10)
        assert status == 200 and b"edge_build_info" in body
        for s in idle:
            assert s.recv(100) == b""  # the server closed it (timeout)
    finally:
        for s in idle:
            s.close()
        publisher.stop()


def scrape_until_ok(url: str, timeout_s: float) -> tuple[int, bytes]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _get(url, timeout=2.0)
        except (OSError, urllib.error.URLError):
            assert time.monotonic() < deadline, f"no answer from {url} within {timeout_s} s"
            time.sleep(0.1)


def test_listener_on_every_interface_when_allowed(fake_server):
    publisher = MetricsPublisher(registry_for(fake_server))
    publisher.start_listener("0.0.0.0", 0)
    try:
        assert publisher.address[0] == "0.0.0.0"
        assert _get(f"http://127.0.0.1:{publisher.address[1]}/metrics")[0] == 200
    finally:
        publisher.stop()


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize("text, expected", [
    ("9464", ("127.0.0.1", 9464)), (":9464", ("127.0.0.1", 9464)), ("localhost:9", ("localhost", 9)),
    ("[::1]:9464", ("::1", 9464)), ("0.0.0.0:0", ("0.0.0.0", 0)),
])
def test_parse_listen(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["::1:9464", "host:", "host:http", "1.2.3.4:65536", ""])
def test_parse_listen_refuses(text):
    with pytest.raises(ValueError):
        parse_listen(text)


@pytest.mark.parametrize("argv, env, message", [
    (["--metrics-listen", "0.0.0.0:9464"], {}, "argument --metrics-listen: 0.0.0.0 accepts connections from other "
                                               "machines"),
    (["--metrics-listen", "[::]:9464"], {}, "add --metrics-listen-any"),
    (["--metrics-listen", "192.168.1.20:9464"], {}, "listen on 127.0.0.1:9464 (this machine only)"),
    ([], {"EDGE_METRICS_LISTEN": "myhost:9464"}, "EDGE_METRICS_LISTEN: myhost accepts connections"),
    (["--metrics-listen", "127.0.0.1:x"], {}, "port 'x' is not a number"),
    (["--metrics-listen-any"], {}, "it is for --metrics-listen HOST:PORT"),
    (["--metrics-textfile", "/tmp", "--metrics-interval", "0"], {}, "--metrics-interval: give seconds > 0"),
    (["--metrics-interval", "inf"], {}, "--metrics-interval: give seconds > 0 and at most 86400"),
    (["--metrics-interval", "nan"], {}, "--metrics-interval: give seconds > 0 and at most 86400"),
    ([], {"EDGE_METRICS_INTERVAL_S": "often"}, "'often' is not a number (from the flag or EDGE_METRICS_INTERVAL_S)"),
])
def test_settings_refuse(argv, env, message, capsys):
    with pytest.raises(SystemExit) as ei:
        parse_serve_args(argv, env=env)
    assert ei.value.code == 2 and message in capsys.readouterr().err


def test_settings_accept():
    args = parse_serve_args([], env={})
    assert (args.metrics_textfile, args.metrics_listen, args.metrics_interval, args.metrics_listen_any) == (
        None, None, 15.0, False)
    args = parse_serve_args(["--metrics-listen", "0.0.0.0:9464", "--metrics-listen-any"], env={})
    assert args.metrics_listen == "0.0.0.0:9464" and args.metrics_listen_any
    env = {"EDGE_METRICS_TEXTFILE": "/var/lib/node_exporter", "EDGE_METRICS_INTERVAL_S": "30",
           "EDGE_METRICS_LISTEN": "[::]:9464", "EDGE_METRICS_LISTEN_ANY": "1"}
    args = parse_serve_args([], env=env)
    assert (args.metrics_textfile, args.metrics_interval, args.metrics_listen) == (
        "/var/lib/node_exporter", 30.0, "[::]:9464")
    assert parse_serve_args(["--metrics-listen", "[::1]:9464"], env={}).metrics_listen == "[::1]:9464"


# ------------------------------------------------------------------ the boot's check


def test_check_without_prometheus_client_names_the_extra(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "prometheus_client" else real(n, *a))
    with pytest.raises(BootError) as ei:
        check_metrics_export(argparse.Namespace(metrics_textfile=str(tmp_path), metrics_listen=None))
    assert ei.value.code == ErrorCode.METRICS_UNAVAILABLE == 4032
    assert "pip install 'edge[metrics]'" in str(ei.value)


def test_check_refuses_a_directory_that_is_not_one(tmp_path):
    (tmp_path / "file").write_text("")
    for d in (tmp_path / "absent", tmp_path / "file"):
        with pytest.raises(BootError, match="is not a directory"):
            check_metrics_export(argparse.Namespace(metrics_textfile=str(d), metrics_listen=None))
    check_metrics_export(argparse.Namespace(metrics_textfile=str(tmp_path), metrics_listen=None))
    check_metrics_export(argparse.Namespace(metrics_textfile=None, metrics_listen="9464"))


def test_render_is_the_text_format(fake_server):
    data = render(registry_for(fake_server))
    assert data.endswith(b"\n") and b"# HELP edge_build_info " in data and b"# TYPE edge_batch_size histogram" in data
