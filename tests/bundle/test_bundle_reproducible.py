"""A bundle is a build artifact (issue 31): the same commit, package, engine and dependency
versions, built from two checkouts at two paths with two virtual environments at two paths (one
under /tmp), give one bundle digest and one OCI image digest, and neither bundle names the build
host's checkout, environment or home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path


from support.bundles import REPO

# What an onnxruntime bundle runs: the runtime's dependencies, its engine, and prometheus_client, which
# a bundle carries whole when the environment has it (image/bundle/metrics.py)
RUNTIME_DISTS = ["numpy", "pyzmq", "flatbuffers", "msgpack", "onnxruntime", "prometheus-client"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def _checkout_of_this_tree(dest: Path) -> Path:
    """A checkout at ``dest`` whose HEAD is this working tree's files (tracked and new, as git
    lists them), committed: the code under test, whether or not it is committed here."""
    dest.mkdir(parents=True)
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())
            os.chmod(dest / name, src.stat().st_mode & 0o755)
    _git(dest.parent, "init", "-q", str(dest))
    _git(dest, "add", "-A")
    env = {**os.environ, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    subprocess.run(["git", "-C", str(dest), "-c", "user.name=edge", "-c", "user.email=edge@localhost", "commit",
                    "-q", "-m", "the tree under test"], check=True, env=env, capture_output=True)
    return dest


def _venv_with_this_hosts_pins(dest: Path) -> str:
    """A fresh virtual environment at ``dest`` with the runtime's dependencies at this one's versions."""
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
    pins = [f"{d}=={version(d)}" for d in RUNTIME_DISTS]
    r = subprocess.run([str(dest / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", *pins],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return str(dest / "bin" / "python")


def _build(checkout: Path, python: str, package: Path, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(checkout)  # the builder of that checkout, nothing of this one's
    r = subprocess.run([python, "-m", "image.build_bundle", "build", "--out", str(out), "--package", str(package),
                        "--quiet"], cwd=str(checkout), env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([python, "-m", "image.build_bundle", "image", "--bundle", str(out), "--out",
                        str(out.parent / "image")], cwd=str(checkout), env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    meta = json.loads((out / "edge-bundle.json").read_text())
    meta["image_index"] = json.loads((out.parent / "image" / "index.json").read_text())
    return meta


def _differences(one: Path, two: Path) -> list[str]:
    """What differs between two bundles' rootfs and config.json (the failure's message)."""
    import hashlib

    def listing(b: Path) -> dict[str, str]:
        out = {"config.json": hashlib.sha256((b / "config.json").read_bytes()).hexdigest()}
        for p in (b / "rootfs").rglob("*"):
            rel = str(p.relative_to(b))
            out[rel] = os.readlink(p) if p.is_symlink() else (
                hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
        return out

    a, b = listing(one), listing(two)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))[:40]


def _named(bundle: Path, needles: list[str]) -> list[str]:
    """Files of ``bundle`` (config.json, edge-bundle.json, rootfs.files, the rootfs) holding a needle."""
    found = []
    for path in [bundle / "config.json", bundle / "edge-bundle.json", bundle / "rootfs.files",
                 *(p for p in (bundle / "rootfs").rglob("*") if p.is_file() and not p.is_symlink())]:
        data = path.read_bytes()
        found += [f"{path.relative_to(bundle)}: {n}" for n in needles if n.encode() in data]
    for link in (p for p in (bundle / "rootfs").rglob("*") if p.is_symlink()):
        found += [f"{link.relative_to(bundle)} -> {n}" for n in needles if n in os.readlink(link)]
    return found


def _home_paths() -> list[str]:
    """The build user's home, as the paths of what it holds (a bare ``/root`` is in manylinux wheels'
    build strings, the same on every host: image/build_bundle.py ``_host_paths``)."""
    home = os.path.expanduser("~")
    return [os.path.join(home, n) for n in sorted(os.listdir(home))]


def test_two_checkouts_two_venvs_two_paths_one_digest(minilm_package, tmp_path, capsys):
    with tempfile.TemporaryDirectory(prefix="edge-repro-", dir="/var/tmp") as other:
        a = _checkout_of_this_tree(tmp_path / "one" / "edge")  # under /tmp
        b = Path(other) / "elsewhere" / "checkout"
        b.parent.mkdir()
        _git(b.parent, "clone", "-q", str(a), str(b))
        venv_b = Path(other) / "env"
        python_b = _venv_with_this_hosts_pins(venv_b)
        one = _build(a, sys.executable, minilm_package, tmp_path / "out" / "bundle")
        two = _build(b, python_b, minilm_package, Path(other) / "out" / "bundle")
        commit = _git(a, "rev-parse", "HEAD")
        assert one["edge"]["commit"] == two["edge"]["commit"] == commit  # clean trees: exact lineage
        assert one["bundle_sha256"] == two["bundle_sha256"], _differences(tmp_path / "out" / "bundle",
                                                                          Path(other) / "out" / "bundle")
        assert one["image_index"] == two["image_index"]  # the same manifest digests
        needles = [str(a), str(b), sys.prefix, str(venv_b), str(REPO), other, str(tmp_path), *_home_paths()]
        for bundle in (tmp_path / "out" / "bundle", Path(other) / "out" / "bundle"):
            assert _named(bundle, needles) == []
            config = json.loads((bundle / "config.json").read_text())
            assert f"EDGE_CODE_COMMIT={commit}" in config["process"]["env"]
    digest = one["image_index"]["manifests"][0]["digest"]
    with capsys.disabled():
        print(f"\n[reproducible] bundle {one['bundle_sha256'][:16]} from {a} with {sys.prefix} and from {b} with "
              f"{venv_b}; image manifest {digest[:23]}; rootfs {one['sizes']['rootfs_bytes']:,} B")
