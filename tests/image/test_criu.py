"""CRIU >= 4.1, as ``image/criu/build.sh`` builds it, patched (docs/bundle.md, "CRIU").

Snapshot boot (``runc checkpoint``/``runc restore``) needs CRIU >= 4.1: bookworm's 3.17.1
dies on this kernel's vDSO. ``.ci/run`` runs the script before pytest, so here CRIU must be
there: a missing or old one fails (naming the script), it is never skipped. Only the checks
that need root (``criu check``, the script's refusal path) skip when the tests are not root.

runc runs ``criu`` through a PATH lookup (its ``--criu`` default is the bare name), with the
PATH it was started with: the tests' own, or systemd's default for ``edge.service``.
``shutil.which`` is the same lookup.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "image" / "criu" / "build.sh"
# systemd's default PATH for services (and root's ENV_SUPATH in /etc/login.defs on Debian).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOOKUPS = {"this process's PATH": None, "systemd's default PATH": SYSTEMD_PATH}
MIN = (4, 1)
FIX = "run image/criu/build.sh as root (about 30 s to build; .ci/run does it before pytest)"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="criu check and the build script need root")


def _version(binary: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return None
    m = re.search(r"^Version:\s*(\d+(?:\.\d+)*)", out, flags=re.M)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def _criu(path: str | None = None) -> str:
    """The criu runc would run with this PATH (None: the process's), >= 4.1, or a failure."""
    found = shutil.which("criu", path=path)
    where = f"PATH={path or os.environ.get('PATH', '')}"
    if found is None:
        pytest.fail(f"no criu on {where}: {FIX}")
    version = _version(found)
    if version is None or version < MIN:
        shown = ".".join(map(str, version)) if version else "unknown"
        pytest.fail(f"criu on {where} is {found}, version {shown}; CRIU >= 4.1 is needed: {FIX}")
    return found


@pytest.mark.parametrize("path", list(LOOKUPS.values()), ids=list(LOOKUPS))
def test_criu_runc_finds_is_at_least_4_1(path):
    found = _criu(path)
    assert _version(found)[:2] >= MIN


def test_build_script_is_idempotent():
    _criu()  # absent: fail here rather than build for a minute inside the test
    t0 = time.monotonic()
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "already installed" in proc.stdout and "nothing to do" in proc.stdout, proc.stdout
    assert elapsed < 10, f"a run with CRIU present took {elapsed:.1f} s"


@needs_root
def test_build_script_refuses_a_wrong_sha256(tmp_path):
    bogus = tmp_path / "criu_4.1.1.orig.tar.xz"
    bogus.write_bytes(b"not the CRIU source\n")
    before = os.stat("/usr/local/sbin/criu").st_mtime_ns if os.path.exists("/usr/local/sbin/criu") else None
    proc = subprocess.run([str(SCRIPT), "--force"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CRIU_TARBALL": str(bogus)})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "sha256 mismatch" in proc.stderr and "refusing" in proc.stderr, proc.stderr
    assert "f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe" in proc.stderr
    after = os.stat("/usr/local/sbin/criu").st_mtime_ns if os.path.exists("/usr/local/sbin/criu") else None
    assert after == before, "the refused run touched /usr/local/sbin/criu"


@needs_root
@pytest.mark.parametrize("path", list(LOOKUPS.values()), ids=list(LOOKUPS))
def test_criu_check_looks_good(path):
    found = _criu(path)
    proc = subprocess.run([found, "check"], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Looks good" in out, f"{found} check (rc {proc.returncode}):\n{out}"


@pytest.mark.parametrize("path", list(LOOKUPS.values()), ids=list(LOOKUPS))
def test_the_criu_runc_finds_is_the_patched_build(path):
    """image/criu/patches/: 4.1.1 dereferences NULL on a network-lock option in a configuration
    file read over RPC, which snapshots use (image/bundle/snapshot.py CRIU_CONF)."""
    from image.bundle.snapshot import CRIU_CONF_OK

    found = _criu(path)
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
    assert f"GitID: {CRIU_CONF_OK}" in out, f"{found} --version:\n{out}\n{FIX}"


def test_every_patch_applies_to_the_source_it_is_for(tmp_path):
    """The patches are unified diffs against criu-4.1.1/ (-p1): the files they change exist there
    with the lines they expect (checked against a copy of the lines, without the tarball)."""
    patches = sorted((REPO / "image" / "criu" / "patches").glob("*.patch"))
    assert patches
    for patch in patches:
        text = patch.read_text()
        assert re.search(r"^--- a/\S+\n\+\+\+ b/\S+\n@@ ", text, re.M), f"{patch.name} is not a -p1 unified diff"
        assert text.startswith("From: ") and "Subject: " in text, f"{patch.name} says nothing of why"
