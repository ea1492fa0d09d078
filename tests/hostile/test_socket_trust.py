"""Where the socket lives: a directory others can change is refused, the file is born 0660,
and the timeline beside it is written through no planted link."""

from __future__ import annotations

import os
import stat

import pytest

from edge.ipc.endpoint import check_socket_dir
from edge.ipc.server import IpcServer
from edge.serving.core import ServingCore
from support.ipc_fakes import FakeEngine, FakeTokenizer

NOBODY = 65534


def _server(sock_dir: str, sub: str) -> IpcServer:
    return IpcServer(f"ipc://{sock_dir}/{sub}/edge.sock", ServingCore(FakeEngine(), FakeTokenizer()))


@pytest.mark.parametrize("mode, owner, refused", [
    (0o750, None, False),  # ours, private: the normal case
    (0o777, None, True),  # anyone may replace the socket
    (0o770, None, True),  # the group may
    (0o1777, None, False),  # sticky, like /tmp: others cannot remove or rename our file
    (0o755, NOBODY, True),  # another user's directory
])
def test_a_socket_directory_others_can_change_is_refused(sock_dir, mode, owner, refused):
    d = os.path.join(sock_dir, "d")
    os.mkdir(d)
    os.chmod(d, mode)
    if owner is not None:
        os.chown(d, owner, owner)
    server = _server(sock_dir, "d")
    try:
        if refused:
            with pytest.raises(PermissionError) as info:
                server.bind()
            assert "socket directory" in str(info.value)
            assert not os.path.exists(os.path.join(d, "edge.sock"))
        else:
            server.bind()
    finally:
        server.request_drain()
        server.wait(5)


def test_a_symlink_of_another_user_to_the_directory_is_refused(sock_dir):
    real = os.path.join(sock_dir, "real")
    os.mkdir(real, 0o750)
    link = os.path.join(sock_dir, "link")
    os.symlink(real, link)
    os.lchown(link, NOBODY, NOBODY)
    with pytest.raises(PermissionError, match="symlink owned by uid 65534"):
        check_socket_dir(link)


def test_the_socket_file_is_born_0660_whatever_the_umask(sock_dir, monkeypatch):
    """No chmod window: with umask 000 and chmod disabled, the file still comes out 0660."""
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    old = os.umask(0)
    server = _server(sock_dir, "run")
    try:
        os.makedirs(os.path.join(sock_dir, "run"), 0o750)
        server.bind()
        mode = stat.S_IMODE(os.stat(os.path.join(sock_dir, "run", "edge.sock")).st_mode)
        assert mode == 0o660, oct(mode)
        assert os.umask(0) == 0  # the process's umask is restored after bind
    finally:
        os.umask(old)
        server.request_drain()
        server.wait(5)


def test_the_timeline_is_written_through_no_planted_link(tmp_path):
    from edge.boot import _write_timeline

    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "timeline.json.tmp").symlink_to(victim)  # the old fixed temporary name
    (tmp_path / "timeline.json").symlink_to(victim)
    _write_timeline(tmp_path / "timeline.json", {"stages": []})
    assert victim.read_text() == "precious"
    target = tmp_path / "timeline.json"
    assert not target.is_symlink() and '"stages"' in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline.json", "timeline.json.tmp", "victim"]


def test_a_second_server_starting_at_the_same_moment_is_refused(sock_dir):
    """The address lock, not the check for a live socket, decides: hold it as a starting server would."""
    import errno
    import fcntl

    os.makedirs(os.path.join(sock_dir, "run"), 0o750)
    path = os.path.join(sock_dir, "run", "edge.sock")
    with open(path + ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        second = _server(sock_dir, "run")
        with pytest.raises(OSError) as info:
            second.bind()
        assert info.value.errno == errno.EADDRINUSE and "starting or serving" in str(info.value)
        assert not os.path.exists(path)
    first = _server(sock_dir, "run")  # once the lock is free, a server binds
    try:
        first.bind()
        assert os.path.exists(path)
    finally:
        first.request_drain()
        first.wait(5)
    assert not os.path.exists(path)
