"""edge/system/socket_dir.py: the bundle's socket directory made the runtime's, its refusals, the stale
leftovers it removes, and its users (edge-supervise, edge-bundle snapshot, edge-coldstart,
the installer, the runtime's bind error).

As root, with the bundle's default runtime uid (61000), in tmp directories; the starts under runc
are tests/bench/test_coldstart_socket_dir.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
from pathlib import Path

import pytest

from edge.system import socket_dir as S
from edge.errors import BootError
from edge.runtime.stages import Stages, stage_error
from edge.runtime.timeline import Timeline

REPO = Path(__file__).resolve().parents[1]
UID = GID = 61000  # the builder's default runtime user
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the runtime's user needs root")


def _owner_mode(path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def _stale_socket(path: Path) -> None:
    """A socket file nobody listens on: bound, then closed (what a killed server leaves)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def _root_leftovers(d: Path) -> None:
    """What `edge serve` run by hand as root leaves: its /run/edge, socket and lock (0600)."""
    d.mkdir(parents=True, exist_ok=True)
    os.chown(d, 0, 0)
    os.chmod(d, 0o755)
    _stale_socket(d / "edge.sock")
    os.close(os.open(d / "edge.sock.lock", os.O_CREAT | os.O_WRONLY, 0o600))


# ------------------------------------------------------------------ what it makes


def test_missing_directory_is_created_with_root_parents(tmp_path):
    d = tmp_path / "a" / "b" / "run"
    old = os.umask(0o077)  # the parents are 0755 whatever the umask
    try:
        done = S.prepare_socket_dir(d, UID, GID)
    finally:
        os.umask(old)
    assert _owner_mode(d) == (UID, GID, 0o750)
    assert _owner_mode(tmp_path / "a") == (0, 0, 0o755) and _owner_mode(tmp_path / "a" / "b") == (0, 0, 0o755)
    assert done == {"path": str(d), "created": True, "chowned_from": None, "chmodded_from": None, "removed": [],
                    "live": []}
    again = S.prepare_socket_dir(d, UID, GID)  # nothing left to do
    assert not again["created"] and not again["chowned_from"] and not again["chmodded_from"] and not again["removed"]


def test_root_owned_directory_and_root_leftovers_become_the_runtimes(tmp_path):
    d = tmp_path / "run"
    _root_leftovers(d)
    for name in S.SNAPSHOT_FILES:
        (d / name).write_text("{}")
    (d / "timeline.json").write_text("{}")  # the runtime replaces it by rename: left alone
    done = S.prepare_socket_dir(d, UID, GID)
    assert _owner_mode(d) == (UID, GID, 0o750)
    assert done["chowned_from"] == "0:0" and done["chmodded_from"] == "0755" and not done["created"]
    assert sorted(done["removed"]) == sorted(["edge.sock", "edge.sock.lock", *S.SNAPSHOT_FILES])
    assert sorted(os.listdir(d)) == ["timeline.json"]


def test_the_runtimes_own_leftovers_stay_unless_snapshot_files(tmp_path):
    d = tmp_path / "run"
    S.prepare_socket_dir(d, UID, GID)
    _stale_socket(d / "edge.sock")
    for name in ("edge.sock", *S.SNAPSHOT_FILES):
        if name != "edge.sock":
            (d / name).write_text("{}")
        os.chown(d / name, UID, GID, follow_symlinks=False)
    assert S.prepare_socket_dir(d, UID, GID)["removed"] == []  # the runtime removes its stale socket itself
    assert sorted(S.prepare_socket_dir(d, UID, GID, snapshot_files=True)["removed"]) == sorted(S.SNAPSHOT_FILES)
    assert os.listdir(d) == ["edge.sock"]


def test_socket_name_comes_from_the_address(tmp_path):
    assert S.ipc_socket_name("ipc:///run/edge/api.sock") == "api.sock"
    assert S.ipc_socket_name("tcp://127.0.0.1:5555") is None and S.ipc_socket_name(None) is None
    d = tmp_path / "run"
    _root_leftovers(d)
    _stale_socket(d / "api.sock")
    done = S.prepare_socket_dir(d, UID, GID, socket_name=S.ipc_socket_name(f"ipc://{d}/api.sock"))
    assert done["removed"] == ["api.sock"] and sorted(os.listdir(d)) == ["edge.sock", "edge.sock.lock"]


def test_a_live_socket_and_its_lock_are_left_alone(tmp_path):
    d = tmp_path / "run"
    _root_leftovers(d)
    os.unlink(d / "edge.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(d / "edge.sock"))
        server.listen(1)
        done = S.prepare_socket_dir(d, UID, GID)
    assert done["removed"] == [] and sorted(done["live"]) == ["edge.sock", "edge.sock.lock"]
    assert _owner_mode(d / "edge.sock.lock")[0] == 0  # the serving runtime's: the new one says "listening"


def test_a_held_lock_counts_as_live(tmp_path):
    d = tmp_path / "run"
    _root_leftovers(d)
    fd = os.open(d / "edge.sock.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a server starting: it holds the lock before it binds
        assert S.prepare_socket_dir(d, UID, GID)["removed"] == []
    finally:
        os.close(fd)
    assert sorted(S.prepare_socket_dir(d, UID, GID)["removed"]) == ["edge.sock", "edge.sock.lock"]


def test_metrics_directory_keeps_its_files(tmp_path):
    d = tmp_path / "metrics"
    d.mkdir()
    (d / "edge.sock.lock").write_text("")
    done = S.prepare_socket_dir(d, UID, GID, 0o755, socket_name=None, leftovers=False)
    assert _owner_mode(d) == (UID, GID, 0o755) and done["removed"] == [] and os.listdir(d) == ["edge.sock.lock"]


# ------------------------------------------------------------------ what it refuses


def test_symlink_is_refused_naming_it_and_its_target(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    link = tmp_path / "run"
    link.symlink_to(target)
    with pytest.raises(S.SocketDirError) as err:
        S.prepare_socket_dir(link, UID, GID)
    assert err.value.reason == "symlink" and err.value.path == str(link)
    assert str(link) in str(err.value) and str(target) in str(err.value) and "rm " in str(err.value)
    assert _owner_mode(target) == (0, 0, 0o755)  # not followed


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o757])
def test_world_writable_is_refused_not_fixed(tmp_path, mode):
    d = tmp_path / "run"
    d.mkdir()
    os.chmod(d, mode)
    (d / "planted").write_text("")
    with pytest.raises(S.SocketDirError) as err:
        S.prepare_socket_dir(d, UID, GID)
    assert err.value.reason == "writable_by_others"
    assert str(d) in str(err.value) and f"{mode:04o}" in str(err.value)
    assert _owner_mode(d) == (0, 0, mode) and os.listdir(d) == ["planted"]


def test_group_writable_is_refused_for_a_foreign_group_only(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    os.chown(d, 0, 4242)
    os.chmod(d, 0o775)
    with pytest.raises(S.SocketDirError) as err:
        S.prepare_socket_dir(d, UID, GID)
    assert err.value.reason == "writable_by_group" and "4242" in str(err.value) and str(d) in str(err.value)
    for group in (0, GID):  # root's or the runtime's own group: trusted, and the mode becomes 0750
        os.chown(d, 0, group)
        os.chmod(d, 0o770)
        S.prepare_socket_dir(d, UID, GID)
        assert _owner_mode(d) == (UID, GID, 0o750)


def test_a_file_is_refused(tmp_path):
    f = tmp_path / "run"
    f.write_text("")
    with pytest.raises(S.SocketDirError) as err:
        S.prepare_socket_dir(f, UID, GID)
    assert err.value.reason == "not_a_directory" and str(f) in str(err.value)
    assert f.is_file()


def test_a_directory_where_a_leftover_belongs_is_refused(tmp_path):
    d = tmp_path / "run"
    (d / "edge.sock.lock").mkdir(parents=True)
    with pytest.raises(S.SocketDirError) as err:
        S.prepare_socket_dir(d, UID, GID)
    assert err.value.reason == "blocked" and str(d / "edge.sock.lock") in str(err.value)


def test_check_is_read_only(tmp_path):
    assert S.check_socket_dir(tmp_path / "missing", GID) is None
    (tmp_path / "ww").mkdir()
    os.chmod(tmp_path / "ww", 0o777)
    with pytest.raises(S.SocketDirError):
        S.check_socket_dir(tmp_path / "ww", GID)
    assert S.check_socket_dir(tmp_path, GID) is not None and _owner_mode(tmp_path)[0] == 0


# ------------------------------------------------------------------ edge-supervise


def test_edge_supervise_prepares_and_refuses_with_one_log_line(tmp_path, capsys):
    from edge.supervise import bundle_start as sup

    d = tmp_path / "run"
    _root_leftovers(d)
    meta = {"socket_dir": str(d), "address": f"ipc://{d}/edge.sock", "user": {"uid": UID, "gid": GID},
            "metrics_dir": str(tmp_path / "m")}
    sup.prepare_host(meta)
    assert _owner_mode(d) == (UID, GID, 0o750) and os.listdir(d) == []
    assert _owner_mode(tmp_path / "m") == (UID, GID, 0o755)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["event"] == "supervise.socket_dir" and line["chowned_from"] == "0:0"
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(SystemExit) as ended:
        sup.prepare_host({**meta, "socket_dir": str(link)})
    assert str(link) in str(ended.value.code) and ended.value.code.startswith("edge-supervise: ")
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["event"] == "supervise.socket_dir_refused" and line["reason"] == "symlink"
    assert line["path"] == str(link)


# ------------------------------------------------------------------ the other starters


def test_snapshot_tool_removes_the_snapshot_files_and_refuses_like_the_others(tmp_path):
    from image.bundle import snapshot as snap

    assert S.SNAPSHOT_FILES == (snap.MARKER, snap.RESUME)
    d = tmp_path / "run"
    d.mkdir()
    for name in S.SNAPSHOT_FILES:
        (d / name).write_text("{}")
        os.chown(d / name, UID, GID)  # the runtime's own marker: still an earlier run's
    from image.bundle.oci_config import STATE_DIR

    state = tmp_path / "state"  # the runtime's state directory, bound read-write: runc needs it made
    config = {"mounts": [{"destination": STATE_DIR, "type": "bind", "source": str(state)}]}
    snap._prepare_socket_dir(d, UID, GID, config)
    assert os.listdir(d) == [] and _owner_mode(d) == (UID, GID, 0o750)
    assert _owner_mode(state) == (UID, GID, 0o750)
    os.chmod(d, 0o777)
    with pytest.raises(snap.SnapshotError, match=str(d)):
        snap._prepare_socket_dir(d, UID, GID, config)


def test_coldstart_refusal_is_a_usage_error(tmp_path):
    from bench.coldstart.args import UsageError
    from bench.coldstart.runtime_runs import prepare_socket_dir

    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"process": {"user": {"uid": UID, "gid": GID}}}))
    d = tmp_path / "run"
    _root_leftovers(d)
    meta = {"socket_dir": str(d), "address": f"ipc://{d}/edge.sock"}
    assert sorted(prepare_socket_dir(bundle, meta)["removed"]) == ["edge.sock", "edge.sock.lock"]
    assert _owner_mode(d) == (UID, GID, 0o750)
    os.chmod(d, 0o777)
    with pytest.raises(UsageError, match=f"--bundle {bundle}: the socket directory {d} is writable by others"):
        prepare_socket_dir(bundle, meta)


# ------------------------------------------------------------------ the installer


def _real_bundle_archive(tmp_path: Path, socket_dir: str):
    """A small signed archive whose edge-bundle.json names a socket directory and a user."""
    from support.archives import fake_bundle, keygen, pack

    private, public = keygen(tmp_path / "keys")
    bundle = fake_bundle(tmp_path / "bundle", 1, big=4096)
    meta = json.loads((bundle / "edge-bundle.json").read_text())
    meta.update(socket_dir=socket_dir, address=f"ipc://{socket_dir}/edge.sock", user={"uid": UID, "gid": GID})
    (bundle / "edge-bundle.json").write_text(json.dumps(meta))
    root = tmp_path / "root"
    (root / "etc/edge/keys").mkdir(parents=True)
    (root / "etc/edge/keys/edge-signing.pub").write_bytes(public.read_bytes())
    return pack(bundle, private, tmp_path / "b.edgebundle"), root


def test_installer_prepares_the_socket_dir_under_its_root(tmp_path):
    from edge.update.install.installer import install
    from edge.update.install.layout import DeviceLayout

    archive, root = _real_bundle_archive(tmp_path, "/run/edge")
    _root_leftovers(root / "run/edge")
    report = install(archive, DeviceLayout(root), restart=False)
    assert _owner_mode(root / "run/edge") == (UID, GID, 0o750) and os.listdir(root / "run/edge") == []
    assert any(f"socket directory {root}/run/edge: owner was 0:0" in n for n in report.notes), report.notes


def test_installer_refuses_before_the_switch(tmp_path):
    from edge.update.install.errors import NotReady
    from edge.update.install.installer import install
    from edge.update.install.layout import DeviceLayout

    archive, root = _real_bundle_archive(tmp_path, "/run/edge")
    (root / "run").mkdir()
    (root / "run/edge").symlink_to("/tmp")
    layout = DeviceLayout(root)
    with pytest.raises(NotReady, match=f"socket directory {root}/run/edge is a symlink to /tmp") as err:
        install(archive, layout, restart=False)
    assert err.value.exit_code == 2 and "nothing was switched" in str(err.value)
    assert not os.path.lexists(layout.current) and not os.path.lexists(layout.slots_dir)  # checked before the unpack


# ------------------------------------------------------------------ the bind stage's advice


def test_a_callable_setting_is_computed_only_on_failure():
    calls = []

    def advice():
        calls.append(1)
        return "the socket directory"

    def bind():
        raise PermissionError(13, "Permission denied")

    stages = Stages(Timeline(exec_s=0.0))
    assert stages.run(lambda: 1, setting=advice) == 1 and calls == []
    with pytest.raises(BootError) as err:
        stages.run(bind, setting=advice)
    assert calls == [1] and err.value.setting == "the socket directory"
    assert "(change: the socket directory)" in str(err.value)
    broken = stage_error("bind", OSError("x"), lambda: 1 / 0)  # the advice never hides the error
    assert "OSError: x" in str(broken) and "ZeroDivisionError" in broken.setting


def test_bind_advice_names_the_directory_its_owner_and_the_fix(tmp_path):
    d = tmp_path / "run"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    text = S.bind_advice(str(d), "/run/edge-host", uid=UID)
    assert text.startswith(f"the bundle's socket directory {d} (host: /run/edge-host) belongs to uid 0 gid 0, "
                           f"mode 0755, and the runtime runs as uid {UID}: ")
    assert "edge-supervise" in text and "chown 61000:0 /run/edge-host && chmod 0750 /run/edge-host" in text
    os.chown(d, UID, GID)
    assert "another server" in S.bind_advice(str(d), None, uid=UID)
    assert "cannot be read" in S.bind_advice(str(tmp_path / "gone"), None, uid=UID)


def test_the_bind_stage_says_bind_outside_a_bundle_and_the_directory_in_one(tmp_path, monkeypatch):
    from edge.boot import _bind_setting

    d = tmp_path / "run"
    d.mkdir(mode=0o755)
    monkeypatch.delenv("EDGE_BUNDLE_SHA256", raising=False)
    assert _bind_setting(f"ipc://{d}/edge.sock") == "--bind ADDR"
    monkeypatch.setenv("EDGE_BUNDLE_SHA256", "ab" * 32)
    monkeypatch.setenv("EDGE_BUNDLE_SOCKET_DIR", "/run/edge-host")
    assert _bind_setting("tcp://127.0.0.1:5555") == "--bind ADDR"  # a tcp bundle has no directory to blame
    assert _bind_setting(f"ipc://{d}/edge.sock").startswith(f"the bundle's socket directory {d} (host: /run/edge-host)")
