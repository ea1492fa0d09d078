"""Archives the installer refuses: the exit status is 1, and the device root is byte-identical
afterwards (paths, types, modes, owners, contents): the live slot, `current`, the state."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from install_support import run_cli, tree_digest
from support.archives import fake_bundle, manifest_of_archive, pack, pack_crafted

from edge.update.install.archive import parse_manifest
from edge.update.install.compat import DeviceFacts, check_compatible, device_facts
from edge.update.install.errors import Refused
from edge.update.install.layout import DeviceLayout


def _device_root(top: Path, keys) -> Path:
    root = top / "root"
    (root / "etc/edge/keys").mkdir(parents=True)
    (root / "etc/edge/keys/edge-signing.pub").write_bytes(keys["trusted"][1].read_bytes())
    return root


@pytest.fixture(scope="module")
def live_root(tmp_path_factory, keys, archives) -> Path:
    """Both slots full: bundle 1 in slot a, bundle 2 in slot b, live and committed. Shared by the
    tests of this module: each one checks that it is unchanged afterwards."""
    from edge.update.install.installer import install, mark_good

    root = _device_root(tmp_path_factory.mktemp("live"), keys)
    for v in (1, 2):
        install(archives[v], DeviceLayout(root), restart=False)
    mark_good(DeviceLayout(root))
    return root


def _refused(capsys, root: Path, archive: Path, kind: str | None, *extra: str) -> str:
    before = tree_digest(root)
    code, out, err = run_cli(capsys, "install", archive, "--root", root, *extra)
    assert code == 1, (out, err)
    assert (f"refused ({kind})" if kind else "refused (") in err, err
    assert "nothing was installed" in err
    assert tree_digest(root) == before
    assert DeviceLayout(root).live_slot() == ("b", None)
    return err


# Fractions of the file where one byte is flipped, then the zstd frame's last 4 bytes (its
# content checksum) and the byte before them.
FLIPS = [0.0, 0.02, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 0.98, -4, -1, -5]


@pytest.mark.parametrize("where", FLIPS)
def test_one_flipped_byte_is_refused(capsys, live_root, archives, tmp_path, where):
    data = bytearray(archives[3].read_bytes())
    pos = where if isinstance(where, int) else int(len(data) * where)
    data[pos] ^= 0x01
    bad = tmp_path / "flipped.edgebundle"
    bad.write_bytes(bytes(data))
    _refused(capsys, live_root, bad, kind=None)  # which check fails depends on where the byte landed


def test_cut_archive_is_refused(capsys, live_root, archives, tmp_path):
    bad = tmp_path / "cut.edgebundle"
    bad.write_bytes(archives[3].read_bytes()[:-100])
    _refused(capsys, live_root, bad, kind=None)


def test_wrong_key(capsys, live_root, keys, bundles, tmp_path):
    bad = pack(bundles[3], keys["stranger"][0], tmp_path / "stranger.edgebundle")
    err = _refused(capsys, live_root, bad, "signature")
    assert "not trusted here" in err


def test_manifest_changed_after_signing(capsys, live_root, keys, bundles, tmp_path):
    bad = pack_crafted(bundles[3], keys["trusted"][0], tmp_path / "edited.edgebundle",
                       resign=lambda data: data.replace(b'"edge_version": "0.1.0"', b'"edge_version": "0.1.1"'))
    err = _refused(capsys, live_root, bad, "signature")
    assert "changed after signing" in err


def test_incompatible_arch(capsys, live_root, keys, tmp_path):
    bad = pack(fake_bundle(tmp_path / "arm", 3, arch="aarch64"), keys["trusted"][0], tmp_path / "arm.edgebundle")
    err = _refused(capsys, live_root, bad, "compatibility")
    assert "built for aarch64" in err


def test_device_json_names_the_arch_of_another_root(capsys, keys, bundles, tmp_path):
    root = _device_root(tmp_path, keys)
    (root / "etc/edge/device.json").write_text(json.dumps({"arch": "aarch64"}))
    arm = pack(fake_bundle(tmp_path / "arm", 3, arch="aarch64"), keys["trusted"][0], tmp_path / "arm.edgebundle")
    code, out, err = run_cli(capsys, "install", arm, "--root", root)
    assert code == 0, err
    host = pack(bundles[3], keys["trusted"][0], tmp_path / "x86.edgebundle")
    before = tree_digest(root)
    code, _, err = run_cli(capsys, "install", host, "--root", root)
    assert code == 1 and tree_digest(root) == before
    assert "etc/edge/device.json arch" in err


def test_full_disk(capsys, live_root, archives, keys, tmp_path):
    unpacked = manifest_of_archive(archives[3]).unpacked_bytes
    need = unpacked + unpacked // 10  # 10% margin
    err = _refused(capsys, live_root, archives[3], "space", "--assume-free", str(need - 1))
    assert f"{need / (1 << 20):.1f} MiB" in err and "(--assume-free)" in err
    fresh = _device_root(tmp_path, keys)
    assert run_cli(capsys, "install", archives[3], "--root", fresh, "--assume-free", str(need))[0] == 0


def _evil(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("bundle/rootfs/etc/evil")
    info.size = 4
    tar.addfile(info, io.BytesIO(b"evil"))


def _edit(case: str):
    def edit(m: dict) -> None:
        files = {f["path"]: f for f in m["files"]}
        if case == "size":
            files["bundle/config.json"]["size"] += 1
            m["unpacked_bytes"] += 1
        elif case == "type":
            empty = files["bundle/rootfs/etc/empty"]
            empty["type"] = "dir"
            for k in ("size", "sha256", "mtime"):
                del empty[k]
        elif case == "dotdot":
            m["files"].append({"path": "bundle/../../etc/passwd", "type": "dir", "mode": 0o755})
        elif case == "absolute":
            m["files"].append({"path": "/etc/cron.d", "type": "dir", "mode": 0o755})
        elif case == "link leaves":
            files["bundle/rootfs/lib64"]["target"] = "../../../../etc"
        elif case == "below a symlink":
            m["files"].append({"path": "bundle/rootfs/lib64/x", "type": "dir", "mode": 0o755})
        elif case == "unpacked_bytes":
            m["unpacked_bytes"] += 1
        elif case == "setuid":
            files["bundle/rootfs/usr/bin/python3"]["mode"] = 0o4755
        elif case == "bad field":
            m["format"] = 2
        elif case == "mtime":
            files["bundle/config.json"]["mtime"] += 1
    return edit


CRAFTED = {  # case -> (how the archive is made wrong, the check that refuses it)
    "extra member": ({"extra": _evil}, "member"),
    "missing member": ({"skip": {"bundle/rootfs/etc/empty"}}, "member"),
    "not listed": ({"rename": {"bundle/rootfs/etc/empty": "bundle/rootfs/etc/evil"}}, "member"),
    "size": ({"edit": _edit("size")}, "member"),
    "type": ({"edit": _edit("type")}, "member"),
    "mtime": ({"edit": _edit("mtime")}, "member"),
    "dotdot": ({"edit": _edit("dotdot")}, "manifest"),
    "absolute": ({"edit": _edit("absolute")}, "manifest"),
    "link leaves": ({"edit": _edit("link leaves")}, "manifest"),
    "below a symlink": ({"edit": _edit("below a symlink")}, "manifest"),
    "unpacked_bytes": ({"edit": _edit("unpacked_bytes")}, "manifest"),
    "setuid": ({"edit": _edit("setuid")}, "manifest"),
    "bad field": ({"edit": _edit("bad field")}, "manifest"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_archives_that_do_not_match_their_manifest(capsys, live_root, keys, bundles, tmp_path, case):
    how, kind = CRAFTED[case]
    bad = pack_crafted(bundles[3], keys["trusted"][0], tmp_path / "bad.edgebundle", **how)
    err = _refused(capsys, live_root, bad, kind)
    if case == "bad field":
        assert "format" in err  # pydantic's message names the field


def _manifest(**compatible):
    m = {"format": 1, "created": "2026-12-01T03:40:00+00:00", "edge_version": "0.1.0", "key_id": "0" * 16,
         "bundle_sha256": "0" * 64, "engine": "onnxruntime",
         "package": {"name": "p", "package_sha256": "0" * 64, "model_sha256": "0" * 64, "tokenizer_sha256": None},
         "compatible": {"arch": "aarch64", "l4t": None, "devices": [], **compatible}, "unpacked_bytes": 0,
         "files": [{"path": "bundle", "type": "dir", "mode": 0o755}]}
    return parse_manifest(json.dumps(m).encode())


@pytest.mark.parametrize("compatible,facts,why", [
    ({}, ("aarch64", None, None), None),
    ({"l4t": {"min": "36.0", "max": "36.99"}}, ("aarch64", "36.3.0", None), None),
    ({"l4t": {"min": "36.0", "max": "36.3"}}, ("aarch64", "36.3.0", None), None),  # 36.3 covers 36.3.x
    ({"l4t": {"min": "36.4"}}, ("aarch64", "36.4.3", None), None),  # no max: unbounded
    ({"l4t": {"min": "36.0", "max": "36.2"}}, ("aarch64", "36.3.0", None), "runs 36.3.0"),
    ({"l4t": {"min": "36.0", "max": "36.99"}}, ("aarch64", "35.5.0", None), "runs 35.5.0"),
    ({"l4t": {"min": "36.0", "max": "36.99"}}, ("aarch64", None, None), "not a Jetson"),
    ({"devices": ["nvidia,p3768-0000+p3767-0005"]}, ("aarch64", None, ["nvidia,p3768-0000+p3767-0005",
                                                                        "nvidia,tegra234"]), None),
    ({"devices": ["nvidia,p3768-0000+p3767-0005"]}, ("aarch64", None, ["nvidia,p3737-0000"]), "is for the devices"),
    ({"devices": ["nvidia,p3768-0000+p3767-0005"]}, ("aarch64", None, None), "no proc/device-tree"),
    ({}, ("x86_64", None, None), "built for aarch64"),
])
def test_compatibility(compatible, facts, why):
    arch, l4t, dt = facts
    manifest = _manifest(**compatible)
    if why is None:
        check_compatible(manifest, DeviceFacts(arch, "test", l4t, dt))
    else:
        with pytest.raises(Refused, match=why):
            check_compatible(manifest, DeviceFacts(arch, "test", l4t, dt))


def test_device_facts_read_from_the_root(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text(
        "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 "
        "UTC 2025\n")
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/compatible").write_bytes(b"nvidia,p3768-0000+p3767-0005\0nvidia,p3767-0005\0"
                                                           b"nvidia,tegra234\0")
    facts = device_facts(DeviceLayout(tmp_path))
    assert facts.l4t == "36.4.3"
    assert facts.compatible == ["nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005", "nvidia,tegra234"]
