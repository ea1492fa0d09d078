"""The device wheel (image/bundle/wheel.py): built from the commit, refused from a tree whose
shipped files differ unless --allow-dirty, which the lineage then says; the same bytes from any
checkout of the same commit."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from image.bundle.wheel import DirtyTree, build_device_wheel, install_wheel

PYPROJECT = '[project]\nname = "edge"\nversion = "0.1.0"\ndependencies = ["numpy>=1.24"]\n'


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _repo(path: Path) -> Path:
    (path / "edge").mkdir(parents=True)
    (path / "edge" / "__init__.py").write_text('__version__ = "0.1.0"\n')
    (path / "edge" / "boot.py").write_text("print('boot')\n")
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / ".gitignore").write_text("*.log\n")
    _git(path.parent, "init", "-q", str(path))
    _git(path, "add", ".")
    _git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return path


def test_a_clean_tree_gives_the_commits_wheel_the_same_bytes_from_any_checkout(tmp_path):
    repo = _repo(tmp_path / "a")
    clone = tmp_path / "elsewhere" / "b"
    clone.parent.mkdir()
    _git(tmp_path, "clone", "-q", str(repo), str(clone))
    one = build_device_wheel(repo, tmp_path / "w1")
    two = build_device_wheel(clone, tmp_path / "w2")
    assert one.commit == _git(repo, "rev-parse", "HEAD") and one.dirty_sha256 is None
    assert one.path.read_bytes() == two.path.read_bytes() and one.sha256 == two.sha256
    with zipfile.ZipFile(one.path) as zf:
        names = zf.namelist()
        assert json.loads(zf.read("edge/_build_info.json")) == {"commit": one.commit, "dirty_sha256": None}
        assert "Requires-Dist: numpy>=1.24" in zf.read("edge-0.1.0.dist-info/METADATA").decode()
    assert not any(n.startswith(("image/", "bench/")) for n in names)  # one top-level name: edge
    site = install_wheel(one.path, tmp_path / "site")
    assert (site / "edge" / "boot.py").read_text() == "print('boot')\n"


@pytest.mark.parametrize("change", ["edit", "add", "delete"])
def test_a_dirty_tree_is_refused_naming_the_file(tmp_path, change):
    repo = _repo(tmp_path / "a")
    if change == "edit":
        (repo / "edge" / "boot.py").write_text("print('changed')\n")
        named = "edge/boot.py"
    elif change == "add":
        (repo / "edge" / "new.py").write_text("")
        named = "edge/new.py"
    else:
        (repo / "edge" / "boot.py").unlink()
        named = "edge/boot.py"
    (repo / "build.log").write_text("ignored files and files outside edge/ do not count")
    with pytest.raises(DirtyTree) as info:
        build_device_wheel(repo, tmp_path / "w")
    assert named in str(info.value) and "--allow-dirty" in str(info.value)
    assert not (tmp_path / "w").exists()


def test_allow_dirty_marks_the_lineage_and_digests_the_difference(tmp_path):
    repo = _repo(tmp_path / "a")
    (repo / "edge" / "boot.py").write_text("print('changed')\n")
    one = build_device_wheel(repo, tmp_path / "w1", allow_dirty=True)
    sha = _git(repo, "rev-parse", "HEAD")
    assert one.commit == f"{sha}-dirty" and one.dirty_sha256
    with zipfile.ZipFile(one.path) as zf:
        assert zf.read("edge/boot.py") == b"print('changed')\n"  # the tree it was built from
        assert json.loads(zf.read("edge/_build_info.json"))["commit"] == f"{sha}-dirty"
    (repo / "edge" / "boot.py").write_text("print('changed again')\n")
    two = build_device_wheel(repo, tmp_path / "w2", allow_dirty=True)
    assert two.commit == one.commit and two.dirty_sha256 != one.dirty_sha256  # two dirty trees never pass for one
    (repo / "edge" / "boot.py").write_text("print('boot')\n")
    assert build_device_wheel(repo, tmp_path / "w3", allow_dirty=True).commit == sha  # clean again: no mark
