"""The host paths, user and unit drop-in a signed bundle names (edge/update/install/host_paths.py,
docs/archive.md "Host paths"): hostile archives, signed by the trusted key and packed by the real
packer, are refused by the real installer, and the whole device root, and a directory beside it,
are byte-identical afterwards (every path's type, mode, owner and content); the values the
builder ships are accepted; only leftovers of the expected type are removed.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from support.archives import fake_bundle, pack
from install_support import run_cli, tree_digest

from edge.update.install import host_paths as H
from edge.update.install.errors import NotReady, Refused
from edge.update.install.layout import DeviceLayout
from edge.system.socket_dir import prepare_socket_dir
from image.build_bundle import DEFAULT_SOCKET_DIR, DEFAULT_USER, METADATA_NAME, SOCKET_NAME
from image.bundle.limits import UNIT_DROPIN, resource_limits, unit_dropin
from image.bundle.oci_config import STATE_DIR

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="making a directory the runtime's (chown) needs root")
UID, GID = DEFAULT_USER
# What the builder writes by default (image/build_bundle.py), and the real drop-in of the default
# bundle's sizes (image/bundle/limits.py).
SHIPPED = {"socket_dir": DEFAULT_SOCKET_DIR, "address": f"ipc://{DEFAULT_SOCKET_DIR}/{SOCKET_NAME}",
           "state_dir": STATE_DIR, "metrics_dir": None, "user": {"uid": UID, "gid": GID}}
SHIPPED_DROPIN = unit_dropin(resource_limits(181_525_580, 126_955_335))


def _world(root: Path) -> tuple[str, str]:
    """The digests of the device root and of the directory beside it (``outside``)."""
    return tree_digest(root), tree_digest(root.parent / "outside")


def _victims(root: Path) -> None:
    """Files a hostile bundle would go for: ROOT/etc/shadow, an existing ROOT/srv/victim/, and
    beside the root, outside/victim/ with a file."""
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/shadow").write_text("root:*:19000:0:99999:7:::\n")
    os.chmod(root / "etc/shadow", 0o640)
    (root / "srv/victim").mkdir(parents=True)
    os.chmod(root / "srv/victim", 0o755)
    (root / "srv/victim/data").write_text("keep\n")
    outside = root.parent / "outside"
    (outside / "victim").mkdir(parents=True)
    (outside / "victim/shadow").write_text("outside\n")
    os.chmod(outside / "victim", 0o755)


def _archive(tmp_path: Path, keys, meta: dict | None = None, dropin: str | None = SHIPPED_DROPIN,
             extra: dict[str, str] | None = None, links: dict[str, str] | None = None) -> Path:
    """A bundle with the shipped host fields updated by ``meta`` (a None value drops the key),
    ``dropin`` as its limits.conf, ``extra`` files and ``links`` (bundle path -> a file beside
    the rootfs, which the digest does not cover, holding what was at the path), signed
    by the trusted key and packed by the real packer."""
    d = tmp_path / f"b{len(list(tmp_path.glob('b*')))}"
    bundle = fake_bundle(d, 3, big=4096)
    m = json.loads((bundle / METADATA_NAME).read_text())
    m.update(SHIPPED)
    for k, v in (meta or {}).items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    (bundle / METADATA_NAME).write_text(json.dumps(m))
    if dropin is not None:
        (bundle / UNIT_DROPIN).write_text(dropin)
    for rel, text in (extra or {}).items():
        (bundle / rel).write_text(text)
    for rel, target in (links or {}).items():  # the link's target holds what was there
        (bundle / target).write_bytes((bundle / rel).read_bytes())
        (bundle / rel).unlink()
        os.symlink(os.path.relpath(bundle / target, (bundle / rel).parent), bundle / rel)
    return pack(bundle, keys["trusted"][0], tmp_path / f"{d.name}.edgebundle")


@pytest.fixture(scope="module")
def live_root(tmp_path_factory, keys, archives) -> Path:
    """Bundle 1 in slot a, bundle 2 in slot b (live, committed), and the victims. Shared: each
    test checks it is unchanged afterwards."""
    from edge.update.install.installer import install, mark_good

    root = tmp_path_factory.mktemp("host") / "root"
    (root / "etc/edge/keys").mkdir(parents=True)
    (root / "etc/edge/keys/edge-signing.pub").write_bytes(keys["trusted"][1].read_bytes())
    for v in (1, 2):
        install(archives[v], DeviceLayout(root), restart=False)
    mark_good(DeviceLayout(root))
    _victims(root)
    return root


def _install(capsys, root: Path, archive: Path, code: int, *needles: str) -> str:
    before = _world(root)
    got, out, err = run_cli(capsys, "install", archive, "--root", root, "--no-restart")
    assert got == code, (out, err)
    for needle in needles:
        assert needle in err, err
    assert _world(root) == before, "the root or the directory beside it changed"
    return err


def _refused(capsys, root: Path, archive: Path, *needles: str) -> str:
    err = _install(capsys, root, archive, 1, "refused (host)", "nothing was installed", *needles)
    assert DeviceLayout(root).live_slot() == ("b", None)
    return err


# ------------------------------------------------------------------ the escape


ESCAPES = {  # case -> (edge-bundle.json's fields, what the message names)
    "socket dir /etc, socket /x/shadow": ({"socket_dir": "/etc", "address": "ipc:///x/shadow"},
                                          ["socket_dir: '/etc' is not a directory", "address: 'ipc:///x/shadow'"]),
    "socket dir /etc, socket /etc/shadow": ({"socket_dir": "/etc", "address": "ipc:///etc/shadow"}, ["socket_dir"]),
    "socket /etc/shadow in /run/edge": ({"address": "ipc:///etc/shadow"}, ["address: 'ipc:///etc/shadow'"]),
    "dotdot socket dir": ({"socket_dir": "/run/edge/../../etc", "address": "ipc:///run/edge/../../etc/shadow.sock"},
                          ["socket_dir: '/run/edge/../../etc': component '..'"]),
    "dotdot out of the root": ({"socket_dir": "/../../outside/victim",
                                "address": "ipc:///../../outside/victim/shadow.sock"}, ["socket_dir"]),
    "dotdot state dir": ({"state_dir": "/var/lib/edge/../../../outside/victim"}, ["state_dir"]),
    "dotdot metrics dir": ({"metrics_dir": "/var/cache/edge/metrics/../../../../etc"}, ["metrics_dir"]),
    "existing victim directory": ({"socket_dir": "/srv/victim", "address": "ipc:///srv/victim/data"},
                                  ["socket_dir: '/srv/victim'"]),
    "existing victim state dir": ({"state_dir": "/srv/victim"}, ["state_dir: '/srv/victim'"]),
    "the installer's state dir": ({"state_dir": "/var/lib/edge"}, ["state_dir: '/var/lib/edge'"]),
    "the installer's state file": ({"state_dir": "/var/lib/edge/install.json"}, ["state_dir"]),
    "a hidden name": ({"state_dir": "/var/lib/edge/.install.json.tmp-1"}, ["state_dir"]),
    "the cache root": ({"metrics_dir": "/var/cache/edge"}, ["metrics_dir: '/var/cache/edge'"]),
    "a directory below the runtime's": ({"socket_dir": "/run/edge/sub", "address": "ipc:///run/edge/sub/edge.sock"},
                                        ["socket_dir"]),
    "relative": ({"socket_dir": "run/edge", "address": "ipc://run/edge/edge.sock"}, ["socket_dir"]),
    "double slash": ({"socket_dir": "/run//edge", "address": "ipc:///run//edge/edge.sock"}, ["socket_dir"]),
    "a snapshot file as the socket": ({"address": "ipc:///run/edge/snapshot-point.json"}, ["address"]),
    "not a .sock": ({"address": "ipc:///run/edge/shadow"}, ["address"]),
    "another scheme": ({"address": "file:///etc/shadow"}, ["address"]),
    "socket without a socket dir": ({"socket_dir": None, "address": "ipc:///run/edge/edge.sock"}, ["address"]),
}


@pytest.mark.parametrize("case", ESCAPES)
def test_host_paths_outside_the_allow_list_are_refused(capsys, live_root, keys, tmp_path, case):
    meta, needles = ESCAPES[case]
    _refused(capsys, live_root, _archive(tmp_path, keys, meta), *needles)
    assert (live_root / "etc/shadow").read_text().startswith("root:")
    assert stat.S_IMODE(os.lstat(live_root / "etc").st_mode) == 0o755 and os.lstat(live_root / "etc").st_uid == 0


def test_the_escape_on_an_empty_root_writes_nothing(capsys, root, keys, tmp_path):
    """The reported archive, on a root with nothing installed: not even the state directory or
    the slots are created."""
    _victims(root)
    err = _refused_empty(capsys, root, _archive(tmp_path, keys, {"socket_dir": "/etc", "address": "ipc:///x/shadow"}))
    assert "socket_dir" in err and not (root / "var").exists() and not (root / "opt").exists()


def _refused_empty(capsys, root: Path, archive: Path) -> str:
    return _install(capsys, root, archive, 1, "refused (host)", "nothing was installed")


# ------------------------------------------------------------------ the user


@pytest.mark.parametrize("user,needle", [
    ({"uid": 0, "gid": 0}, "user.uid: 0 is not in 60000-61183"),
    ({"uid": 61000, "gid": 0}, "user.gid: 0 is not in"),
    ({"uid": 1000, "gid": 1000}, "user.uid: 1000"),  # a login user
    ({"uid": 999, "gid": 61000}, "user.uid: 999"),  # a system user
    ({"uid": 65534, "gid": 65534}, "user.uid: 65534"),  # nobody
    ({"uid": 61184, "gid": 61184}, "user.uid: 61184"),  # systemd's DynamicUser range
    ({"uid": "61000", "gid": 61000}, "user.uid"),
    ({"uid": True, "gid": 61000}, "user.uid"),
    ({"gid": 61000}, "user.uid"),
    ("root", "user"),
])
def test_a_user_outside_the_range_is_refused(capsys, live_root, keys, tmp_path, user, needle):
    _refused(capsys, live_root, _archive(tmp_path, keys, {"user": user}), needle)


def test_directories_without_a_user_are_refused(capsys, live_root, keys, tmp_path):
    meta = {"user": None}
    _refused(capsys, live_root, _archive(tmp_path, keys, meta), "user: required")


# ------------------------------------------------------------------ the unit's drop-in


DROPINS = {  # case -> (limits.conf, what the message names)
    "an extra key": ("[Service]\nMemoryMax=2G\nExecStartPre=/bin/sh -c 'rm -rf /'\n", "line 3: 'ExecStartPre'"),
    "huge MemoryMax": ("[Service]\nMemoryMax=999999999T\n", "MemoryMax=999999999T: a number from"),
    "MemoryMax above the bound": ("[Service]\nMemoryMax=129G\n", "MemoryMax=129G"),
    "MemoryMax infinity": ("[Service]\nMemoryMax=infinity\n", "MemoryMax=infinity"),
    "MemoryMax percent": ("[Service]\nMemoryMax=90%\n", "MemoryMax=90%"),
    "tiny MemoryMax": ("[Service]\nMemoryMax=1M\n", "MemoryMax=1M"),
    "huge TasksMax": ("[Service]\nTasksMax=1000000\n", "TasksMax=1000000"),
    "TasksMax infinity": ("[Service]\nTasksMax=infinity\n", "TasksMax=infinity"),
    "another section": ("[Service]\nMemoryMax=2G\n[Unit]\nAfter=x\n", "section '[Unit]'"),
    "a key before the section": ("MemoryMax=2G\n[Service]\n", "MemoryMax= before [Service]"),
    "a key twice": ("[Service]\nMemoryMax=2G\nMemoryMax=3G\n", "MemoryMax= twice"),
    "a continued comment": ("[Service]\n# \\\nExecStart=/bin/sh\n", "a continued line"),
    "a control character": ("[Service]\nMemoryMax=2G\r\n", "a control character"),
    "not ASCII": ("[Service]\nMemoryMax=2G\n# \u00e9\n", "not ASCII"),
    "a huge file": ("[Service]\n" + "#" * 5000 + "\n", "more than 4096"),
}


@pytest.mark.parametrize("case", DROPINS)
def test_a_dropin_beyond_the_builders_limits_is_refused(capsys, live_root, keys, tmp_path, case):
    text, needle = DROPINS[case]
    _refused(capsys, live_root, _archive(tmp_path, keys, dropin=text), "edge.service.d/limits.conf", needle)


def test_another_dropin_file_is_refused(capsys, live_root, keys, tmp_path):
    archive = _archive(tmp_path, keys, extra={"edge.service.d/override.conf": "[Service]\nExecStartPre=/bin/true\n"})
    _refused(capsys, live_root, archive, "bundle/edge.service.d/override.conf", "limits.conf only")


@pytest.mark.parametrize("rel,target", [(UNIT_DROPIN, "limits.real"), (METADATA_NAME, "meta.real")])
def test_the_dropin_or_the_metadata_as_a_symlink_is_refused(capsys, live_root, keys, tmp_path, rel, target):
    archive = _archive(tmp_path, keys, links={rel: target})
    _refused(capsys, live_root, archive, f"bundle/{rel} is a symlink in the manifest")


# ------------------------------------------------------------------ this root's directories


def _good_root(root: Path) -> Path:
    _victims(root)
    return root


DEVICE = {  # case -> (how the root is made wrong, what the message names)
    "ROOT/run -> outside (absolute)": (lambda r: os.symlink(r.parent / "outside", r / "run"), "outside the root"),
    "ROOT/run -> /etc (absolute)": (lambda r: os.symlink("/etc", r / "run"), "outside the root"),
    "ROOT/run -> ../../outside (relative)": (lambda r: os.symlink("../../outside", r / "run"), "above the root"),
    "ROOT/run -> etc (in the root, off the list)": (lambda r: os.symlink("etc", r / "run"), "resolves to /etc/edge"),
    "ROOT/run/edge -> /etc": (lambda r: (r / "run").mkdir() or os.symlink("/etc", r / "run/edge"), "a symlink to /etc"),
    "ROOT/var/lib/edge/runtime -> ROOT/etc": (
        lambda r: (r / "var/lib/edge").mkdir(parents=True) or os.symlink(r / "etc", r / "var/lib/edge/runtime"),
        "state_dir"),
    "ROOT/run is a file": (lambda r: (r / "run").write_text(""), "is not a directory"),
    "ROOT/run/edge writable by all": (lambda r: (r / "run/edge").mkdir(parents=True) or os.chmod(r / "run/edge", 0o777),
                                      "writable by others"),
}


@pytest.mark.parametrize("case", DEVICE)
def test_a_root_whose_directories_lead_elsewhere_is_not_ready(capsys, root, keys, tmp_path, case):
    make, needle = DEVICE[case]
    _good_root(root)
    make(root)
    err = _install(capsys, root, _archive(tmp_path, keys), 2, needle, "nothing was switched and nothing written")
    assert not (root / "opt").exists()
    assert ("state_dir" if "var/lib" in case else "socket_dir") in err


def test_resolve_in_root_follows_links_as_the_kernel_does(tmp_path):
    root = tmp_path / "r"
    (root / "run/real").mkdir(parents=True)
    os.symlink("real", root / "run/alias")
    os.symlink("/run/real", root / "run/absolute")  # ROOT=/ only: an absolute link names the host's /
    r = str(root)
    assert H.resolve_in_root(r, "/run/alias/x", "f") == "/run/real/x"
    assert H.resolve_in_root(r, "/run/alias", "f") == "/run/alias"  # the last component is never followed
    assert H.resolve_in_root(r, "/run/missing/x", "f") == "/run/missing/x"
    with pytest.raises(NotReady, match="outside the root"):
        H.resolve_in_root(r, "/run/absolute/x", "f")
    os.symlink(f"{root}/run/real", root / "run/inside")
    assert H.resolve_in_root(r, "/run/inside/x", "f") == "/run/real/x"
    os.symlink("loop", root / "run/loop")
    with pytest.raises(NotReady, match="more than 40 symlinks"):
        H.resolve_in_root(r, "/run/loop/x", "f")


# ------------------------------------------------------------------ what is accepted


def test_the_builders_values_pass():
    """What image/build_bundle.py and image/bundle/limits.py write today, and what the docs and
    the trial tests use, are inside the allow-list."""
    assert H.META == METADATA_NAME and H.DROPIN == UNIT_DROPIN
    host = H.check_meta(json.dumps(SHIPPED).encode())
    assert host.socket_name == SOCKET_NAME and host.user.uid in H.USER_IDS and host.user.gid in H.USER_IDS
    for other in ({"socket_dir": "/run/edge-test", "address": "ipc:///run/edge-test/edge.sock"},
                  {"metrics_dir": "/var/lib/node_exporter/textfile"}, {"metrics_dir": "/var/cache/edge/metrics"},
                  {"address": "tcp://127.0.0.1:5555"}, {"address": None}):
        H.check_meta(json.dumps({**SHIPPED, **other}).encode())
    for package_bytes in (1 << 20, 181_525_580, 8 << 30, 60 << 30):  # the builder's drop-in for small to huge packages
        limits = resource_limits(package_bytes, 126_955_335)
        assert H.check_dropin(unit_dropin(limits).encode()) == {
            "MemoryMax": limits["unit_memory_max"], "TasksMax": limits["unit_tasks_max"]}
    assert H.check_dropin(b"[Service]\nMemoryMax=2G\n") == {"MemoryMax": 2 << 30}  # the test bundles'
    with pytest.raises(Refused):
        H.check_meta(b"[]")


@AS_ROOT
def test_the_shipped_values_install_and_their_directories_are_made_the_runtimes(capsys, root, keys, tmp_path):
    _victims(root)
    archive = _archive(tmp_path, keys, {"metrics_dir": "/var/lib/node_exporter/textfile"})
    code, out, err = run_cli(capsys, "install", archive, "--root", root, "--no-restart")
    assert code == 0, err
    for d, mode in (("run/edge", 0o750), ("var/lib/edge/runtime", 0o750), ("var/lib/node_exporter/textfile", 0o755)):
        st = os.lstat(root / d)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UID, GID, mode), d
    assert os.lstat(root / "var/lib/edge").st_uid == 0  # the installer's own stays root's


# ------------------------------------------------------------------ leftovers: only of the expected type


@AS_ROOT
def test_only_a_socket_and_regular_lock_and_snapshot_files_are_removed(capsys, root, keys, tmp_path):
    """Root's leftovers in ROOT/run/edge: a regular file where the socket goes and a symlink as
    its lock stay (and the symlink's target outside is untouched); a stale socket, a regular lock
    and a regular snapshot file go."""
    _victims(root)
    d = root / "run/edge"
    d.mkdir(parents=True)
    (d / "edge.sock").write_text("not a socket\n")
    os.symlink(root.parent / "outside/victim/shadow", d / "edge.sock.lock")
    (d / "snapshot-point.json").write_text("{}")
    os.symlink(root / "etc/shadow", d / "snapshot-resume.json")
    outside = tree_digest(root.parent / "outside")
    code, _, err = run_cli(capsys, "install", _archive(tmp_path, keys), "--root", root, "--no-restart")
    assert code == 0, err
    assert sorted(os.listdir(d)) == ["edge.sock", "edge.sock.lock", "snapshot-resume.json"]
    assert (d / "edge.sock").read_text() == "not a socket\n" and os.path.islink(d / "edge.sock.lock")
    assert tree_digest(root.parent / "outside") == outside and (root / "etc/shadow").exists()

    os.unlink(d / "edge.sock")
    os.unlink(d / "edge.sock.lock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(d / "edge.sock"))  # a stale socket: nobody listens
    os.mkfifo(d / "edge.sock.lock")
    os.chown(d / "edge.sock", 0, 0)
    done = prepare_socket_dir(d, UID, GID)
    assert done["removed"] == ["edge.sock"] and stat.S_ISFIFO(os.lstat(d / "edge.sock.lock").st_mode)
