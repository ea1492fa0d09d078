"""fs-verity (edge/preload/verity.py): the digest the build host writes, the kernel's measured one
where there is one, and the boot's fall-back to sha256 everywhere else (this machine's kernel has
no CONFIG_FS_VERITY: the tests pass on either).

Small packages (tests/support/packages.py), not the real model.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from edge.errors import ErrorCode, PackageError
from edge.preload import manifest as manifest_mod
from edge.preload import verity
from edge.preload.manifest import Manifest, manifest_digest, open_package
from edge.preload.schema import Invalid
from edge.update.install.fsverity import enable_package_verity
from edge.update.install.layout import PACKAGE_IN_BUNDLE

from support.packages import SMALL_FILES as FILES
from support.packages import write_small_package as write_package

# Printed by fsverity-utils 1.5 (`fsverity digest`) for files of n bytes, byte i = (7 i + 3) mod 256:
# an empty file, one byte, one whole block, one byte over, and 129 blocks (a tree of two levels).
REFERENCE = {
    0: "3d248ca542a24fc62d1c43b916eae5016878e2533c88238480b26128a1f1af95",
    1: "83334d2a5a79c35ecec7b206551570ffb7c723db2fb0ea790e9f63bfb4992858",
    4096: "326c3051712e1f652ccdfaa71ae780da3cccf62304fa7fb03bc7191bc833ff04",
    4097: "fb00345b7ad04abc59ba8e4318de64408d8ee394ee753512546e2f2b454d71ab",
    528384: "09074d50457bedbcfd5ffd4ed5db0e2657db493c3f53e70a487b6083cc592adf",
}
@pytest.mark.parametrize("size", sorted(REFERENCE))
def test_file_digest_is_fsverity_utils_digest(tmp_path, size):
    path = tmp_path / "f"
    path.write_bytes(bytes((7 * i + 3) % 256 for i in range(size)))
    assert verity.file_digest(path) == REFERENCE[size]


@pytest.mark.skipif(shutil.which("fsverity") is None, reason="fsverity-utils not installed (apt-get install fsverity)")
def test_file_digest_matches_the_fsverity_tool_on_random_files(tmp_path):
    rng = random.Random(29)
    for size in (2, 4095, 8192, 128 * 4096, 128 * 4096 + 1, rng.randrange(1, 3 << 20)):
        path = tmp_path / f"f{size}"
        path.write_bytes(rng.randbytes(size))
        out = subprocess.run(["fsverity", "digest", str(path)], capture_output=True, text=True, check=True).stdout
        assert out.split()[0] == f"sha256:{verity.file_digest(path)}", size


def test_measure_is_none_or_the_digest_on_this_file_system(tmp_path):
    """A file never enabled has no measured digest, whatever the kernel; enabling it either works
    (the measured digest is then the build host's) or says Unsupported: both are handled."""
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10000)
    assert verity.measure(path) is None
    assert verity.measure(tmp_path / "absent") is None
    try:
        measured = verity.enable(path)
    except verity.Unsupported:
        assert verity.measure(path) is None
    else:
        assert measured == verity.measure(path) == verity.file_digest(path)


def test_boot_check_falls_back_to_sha256_where_nothing_is_measured(tmp_path):
    """This machine (no fs-verity in its kernel): the files are hashed, and the check says so."""
    write_package(tmp_path / "pkg")
    pkg = open_package(tmp_path / "pkg", verify="none")
    assert set(pkg.manifest.fsverity) == set(FILES)
    methods = pkg.verify_files(["model.ort", "tokenizer.fb"])
    expected = "fsverity" if verity.measure(tmp_path / "pkg" / "model.ort") else "sha256"
    assert methods == {"model.ort": expected, "tokenizer.fb": expected}
    assert pkg.verify_files(["model.ort"], full=False) == {"model.ort": "size"}


def test_a_tampered_file_is_refused_when_nothing_is_measured(tmp_path):
    write_package(tmp_path / "pkg")
    with open(tmp_path / "pkg" / "model.ort", "r+b") as f:
        f.write(b"X")
    pkg = open_package(tmp_path / "pkg", verify="none")
    with pytest.raises(PackageError) as err:
        pkg.verify_files(["model.ort"])
    assert err.value.code == ErrorCode.PACKAGE_HASH_MISMATCH and err.value.file == "model.ort"


def test_a_measured_digest_equal_to_the_manifests_skips_the_hash(tmp_path, monkeypatch):
    """Where the kernel measures the manifest's digest, the boot takes it and hashes nothing."""
    data = write_package(tmp_path / "pkg")
    digests = data["fsverity"]["digests"]
    monkeypatch.setattr(verity, "measure", lambda path: digests[Path(path).name])

    def no_hash(path):
        raise AssertionError(f"{path} was hashed")

    monkeypatch.setattr(manifest_mod, "sha256_file", no_hash)
    pkg = open_package(tmp_path / "pkg", verify="none")
    assert pkg.verify_files(["model.ort", "tokenizer.fb"]) == {"model.ort": "fsverity", "tokenizer.fb": "fsverity"}


@pytest.mark.parametrize("measured", ["00" * 32, OSError(5, "Input/output error")])
def test_a_differing_or_failed_measure_is_hashed_and_a_tampered_file_still_refused(tmp_path, monkeypatch, measured):
    write_package(tmp_path / "pkg")

    def measure(path):
        if isinstance(measured, Exception):
            raise measured
        return measured

    monkeypatch.setattr(verity, "measure", measure)
    pkg = open_package(tmp_path / "pkg", verify="none")
    assert pkg.verify_files(["model.ort"]) == {"model.ort": "sha256"}
    with open(tmp_path / "pkg" / "model.ort", "r+b") as f:
        f.write(b"X")
    with pytest.raises(PackageError) as err:
        pkg.verify_files(["model.ort"])
    assert err.value.code == ErrorCode.PACKAGE_HASH_MISMATCH


def test_a_package_without_digests_opens_and_is_hashed(tmp_path):
    data = write_package(tmp_path / "pkg")
    del data["fsverity"]
    data["package_sha256"] = manifest_digest(data)
    (tmp_path / "pkg" / "manifest.json").write_text(json.dumps(data))
    pkg = open_package(tmp_path / "pkg", verify="full")
    assert pkg.manifest.fsverity == {} and pkg.verify_files(["model.ort"]) == {"model.ort": "sha256"}


@pytest.mark.parametrize("block, field, says", [
    ("sha256", "fsverity", "expected an object"),
    ({"algorithm": "sha512", "block_size": 4096, "digests": {}}, "fsverity.algorithm", "must be one of"),
    ({"algorithm": "sha256", "block_size": 1024, "digests": {}}, "fsverity.block_size", "must be one of"),
    ({"algorithm": "sha256", "block_size": 4096}, "fsverity.digests", "field required"),
    ({"algorithm": "sha256", "block_size": 4096, "digests": {"other.bin": "ab" * 32}}, "fsverity.digests.other.bin",
     "not a file the manifest lists"),
    ({"algorithm": "sha256", "block_size": 4096, "digests": {"model.ort": "AB" * 32}}, "fsverity.digests.model.ort",
     "sha256"),
])
def test_bad_fsverity_blocks_are_refused_naming_the_field(tmp_path, block, field, says):
    data = write_package(tmp_path / "pkg")
    data["fsverity"] = block
    with pytest.raises(Invalid) as info:
        Manifest.model_validate(data)
    assert info.value.where == field and says in info.value.reason


def test_the_installer_enables_it_or_says_why_not(tmp_path):
    """On this machine's file system it says fs-verity is not available, and the install goes on;
    where it is, the files get it and their measured digests are the manifest's."""
    bundle = tmp_path / "slot" / "bundle"
    write_package(bundle / PACKAGE_IN_BUNDLE)
    notes = enable_package_verity(bundle)
    assert len(notes) == 1, notes
    if "not available" in notes[0]:
        assert "hashes the package's files at each boot" in notes[0]
        assert verity.measure(bundle / PACKAGE_IN_BUNDLE / "model.ort") is None
    else:
        assert notes[0].startswith("fs-verity enabled on 2 package file(s)"), notes
        pkg = open_package(bundle / PACKAGE_IN_BUNDLE, verify="none")
        assert pkg.verify_files(["model.ort", "tokenizer.fb"]) == {"model.ort": "fsverity", "tokenizer.fb": "fsverity"}


def test_the_installer_with_a_kernel_that_has_it(tmp_path, monkeypatch):
    """enable() as a kernel with fs-verity answers: the notes name the files, and a digest the
    manifest got wrong is a warning (the runtime then hashes that file)."""
    bundle = tmp_path / "bundle"
    data = write_package(bundle / PACKAGE_IN_BUNDLE)
    right = data["fsverity"]["digests"]
    monkeypatch.setattr(verity, "enable", lambda path: right[Path(path).name] if Path(path).name != "tokenizer.fb"
                        else "00" * 32)
    notes = enable_package_verity(bundle)
    assert notes[0].startswith("fs-verity enabled on 1 package file(s) (model.ort)"), notes
    assert notes[1].startswith("warning: the fs-verity digest of tokenizer.fb differs"), notes


def test_the_installer_leaves_a_bundle_without_a_package_or_digests(tmp_path):
    assert enable_package_verity(tmp_path) == []
    bundle = tmp_path / "b"
    data = write_package(bundle / PACKAGE_IN_BUNDLE)
    del data["fsverity"]
    data["package_sha256"] = manifest_digest(data)
    (bundle / PACKAGE_IN_BUNDLE / "manifest.json").write_text(json.dumps(data))
    assert enable_package_verity(bundle) == []
    os.unlink(bundle / PACKAGE_IN_BUNDLE / "manifest.json")
    assert enable_package_verity(bundle) == []
