"""sd_notify against a real AF_UNIX datagram socket, as systemd/runc listen."""

import os
import socket

import pytest

from edge.system import notify as notify_mod


@pytest.fixture
def listener(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield path, sock
    sock.close()


def test_notify_sends_one_datagram_with_all_fields(listener, monkeypatch):
    path, sock = listener
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    assert notify_mod.notify("READY=1", "STATUS=serving")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving"


def test_notify_abstract_namespace(monkeypatch):
    name = f"edge-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify_mod.notify("READY=1")
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_notify_without_socket_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify_mod.notify("READY=1") is False


def test_notify_to_dead_socket_does_not_raise(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert notify_mod.notify("READY=1") is False
