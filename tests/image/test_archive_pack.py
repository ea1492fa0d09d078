"""Bundle archives, the build host's side (image/archive/, docs/archive.md): keygen, the manifest
model, pack, and the one-pass verify that the installer reuses.

Most tests pack a small bundle-shaped directory made here (milliseconds); one packs the real
MiniLM ORT bundle. Tampering is tested at two depths: a flipped byte of the archive file (the
compressed stream: zstd's checksum or the decoder refuses it first), and a flipped byte of the
tar stream inside, recompressed (so that the signature or a member's sha256 must catch it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

import pytest

from edge.update.archive import keys
from edge.update.archive.compression import DecompressingReader, compressing_writer
from edge.update.archive.errors import ArchiveError, KeyFileError, ManifestError, MemberError, PackError, SignatureError
from edge.update.archive.manifest import MANIFEST_MEMBER, SIGNATURE_MEMBER, Manifest, parse_manifest
from edge.update.archive.verify import ArchiveReader, verify_archive
from image.archive.pack import pack_bundle
from image.bundle.digest import ENV_NAME, bundle_digest

MTIME = 1_780_000_000


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def keypair(tmp_path) -> tuple[Path, Path]:
    private, public, _ = keys.keygen(tmp_path / "keys")
    return private, public


def make_bundle(out: Path, big: int = (3 << 20) // 2) -> Path:
    """A bundle-shaped directory whose edge-bundle.json and config.json carry its real digest."""
    rootfs = out / "rootfs"
    for d in ("usr/bin", "usr/lib64", "etc", "opt/edge/package", "tmp"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    tool = rootfs / "usr/bin/python3"
    tool.write_bytes(b"#!/bin/sh\necho fake\n")
    os.chmod(tool, 0o755)
    (rootfs / "usr/lib64/libfake.so").write_bytes(os.urandom(4096))
    (rootfs / "opt/edge/package/model.onnx").write_bytes(hashlib.sha256(b"w").digest() * (big // 32))
    (rootfs / "etc/empty").write_bytes(b"")
    os.symlink("usr/lib64", rootfs / "lib64")
    os.symlink("/usr/share/zoneinfo/UTC", rootfs / "etc/localtime")  # the container's root, not the host's
    os.chmod(rootfs / "tmp", 0o1777)
    (out / "edge.service.d").mkdir()
    (out / "edge.service.d/limits.conf").write_text("[Service]\nMemoryMax=2G\n")
    for p in rootfs.rglob("*"):
        if not p.is_symlink():
            os.utime(p, (MTIME, MTIME))
    return seal(out)


def seal(bundle: Path) -> Path:
    """Write config.json and edge-bundle.json with the digest of the bundle's rootfs as it is now."""
    config = {"ociVersion": "1.0.2", "process": {"env": ["PATH=/usr/bin"]}, "root": {"path": "rootfs"}}
    digest = bundle_digest(bundle / "rootfs", config)
    config["process"]["env"].append(f"{ENV_NAME}={digest}")
    (bundle / "config.json").write_text(json.dumps(config) + "\n")
    package = {"path": "/opt/edge/package", "name": "fake", "package_sha256": "a" * 64, "model_sha256": "b" * 64,
               "tokenizer_sha256": None}
    (bundle / "edge-bundle.json").write_text(json.dumps({"format": 1, "bundle_sha256": digest, "arch": "x86_64",
                                                         "engine": "onnxruntime", "package": package}) + "\n")
    return bundle


@pytest.fixture
def bundle(tmp_path) -> Path:
    return make_bundle(tmp_path / "bundle")


@pytest.fixture
def packed(tmp_path, bundle, keypair) -> Path:
    out = tmp_path / "fake.edgebundle"
    pack_bundle(bundle, keypair[0], out, l4t_min="36.0", l4t_max="36.99", devices=["nvidia,p3768-0000+p3767-0005"])
    return out


def _tar_of(archive: Path) -> bytes:
    with open(archive, "rb") as f:
        r = DecompressingReader(f)
        data = r.read()
        r.finish()
    return data


def _repack(tar_bytes: bytes, out: Path) -> Path:
    with open(out, "wb") as raw:
        w = compressing_writer(raw, "zstd", level=1)
        w.write(tar_bytes)
        w.close()
    return out


def _offsets(tar_bytes: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
        return {m.name: m for m in t.getmembers()}


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


# ------------------------------------------------------------------ keys


def test_keygen_layout_modes_and_key_id(tmp_path):
    private, public, kid = keys.keygen(tmp_path / "k")
    assert (private.name, public.name) == ("edge-signing.key", "edge-signing.pub")
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")  # SubjectPublicKeyInfo
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = keys.load_public(public).public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert len(raw) == 32 and kid == hashlib.sha256(raw).hexdigest()[:16]
    sig = keys.sign(keys.load_private(private), b"manifest")
    assert len(sig) == 64
    assert keys.verify(sig, b"manifest", keys.load_trusted(tmp_path / "k")) == kid
    with pytest.raises(SignatureError):
        keys.verify(sig, b"manifesT", keys.load_trusted(tmp_path / "k"))
    assert [p.name for p in (tmp_path / "k").iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_keygen_refuses_to_overwrite_without_force(tmp_path):
    _, _, first = keys.keygen(tmp_path / "k")
    with pytest.raises(KeyFileError, match="--force"):
        keys.keygen(tmp_path / "k")
    _, _, second = keys.keygen(tmp_path / "k", force=True)
    assert second != first


def test_keygen_refuses_a_directory_open_to_others(tmp_path):
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    with pytest.raises(KeyFileError, match="chmod 700"):
        keys.keygen(tmp_path / "open")


def test_private_key_open_to_others_or_not_ed25519_is_refused(tmp_path, keypair):
    private, public = keypair
    os.chmod(private, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        keys.load_private(private)
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        keys.load_public(private)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    other = tmp_path / "ec.pub"
    other.write_bytes(ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(KeyFileError, match="not an Ed25519 key"):
        keys.load_public(other)
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyFileError, match="no \\*.pub"):
        keys.load_trusted(tmp_path / "empty")


# ------------------------------------------------------------------ pack and verify


def test_pack_then_verify_and_read_every_member(packed, bundle, keypair):
    manifest = verify_archive(packed, keypair[1].parent)
    assert manifest.key_id == keys.key_id(keys.load_public(keypair[1]))
    assert manifest.bundle_sha256 == json.loads((bundle / "edge-bundle.json").read_text())["bundle_sha256"]
    assert manifest.compatible.l4t.min == "36.0" and manifest.compatible.devices == ["nvidia,p3768-0000+p3767-0005"]
    by_path = {e.path: e for e in manifest.files}
    assert manifest.files[0].path == "bundle" and manifest.files[0].type == "dir"
    assert by_path["bundle/rootfs/lib64"].target == "usr/lib64"
    assert by_path["bundle/rootfs/etc/localtime"].target == "/usr/share/zoneinfo/UTC"
    assert by_path["bundle/rootfs/tmp"].mode == 0o1777
    assert by_path["bundle/rootfs/usr/bin/python3"].mode == 0o755
    assert by_path["bundle/rootfs/usr/bin/python3"].mtime == MTIME  # .pyc files check their source's mtime
    assert manifest.unpacked_bytes == sum((bundle / p[len("bundle/"):]).stat().st_size
                                          for p, e in by_path.items() if e.type == "file")
    # The installer's path: the same reader, content read in odd-sized pieces, then the end checked.
    with ArchiveReader(packed) as archive:
        manifest_bytes, signature = archive.head()
        assert keys.verify(signature, manifest_bytes, keys.load_trusted(keypair[1].parent)) == manifest.key_id
        assert parse_manifest(manifest_bytes) == manifest
        seen = []
        for entry, _member, data in archive.members(manifest):
            seen.append(entry.path)
            if data is not None:
                content = b"".join(iter(lambda data=data: data.read(7777), b""))
                assert content == (bundle / entry.path[len("bundle/"):]).read_bytes()
        archive.finish()
    assert seen == [e.path for e in manifest.files]


def test_pack_is_deterministic_but_for_the_time(tmp_path, bundle, keypair):
    a = pack_bundle(bundle, keypair[0], tmp_path / "a.edgebundle").manifest
    b = pack_bundle(bundle, keypair[0], tmp_path / "b.edgebundle").manifest
    assert a.files == b.files and a.unpacked_bytes == b.unpacked_bytes
    assert not (tmp_path / "a.edgebundle.tmp").exists()


def test_xz_archives_verify_too(tmp_path, bundle, keypair):
    out = tmp_path / "x.edgebundle"
    pack_bundle(bundle, keypair[0], out, compression="xz", level=0)
    assert out.read_bytes()[:6] == b"\xfd7zXZ\x00"
    assert verify_archive(out, keypair[1].parent).files[0].path == "bundle"


def test_out_exists_needs_force(packed, bundle, keypair):
    with pytest.raises(PackError, match="--force"):
        pack_bundle(bundle, keypair[0], packed)
    pack_bundle(bundle, keypair[0], packed, force=True)


def test_engine_and_arch_must_be_the_bundles(tmp_path, bundle, keypair):
    with pytest.raises(PackError, match="runs onnxruntime"):
        pack_bundle(bundle, keypair[0], tmp_path / "t.edgebundle", engine="torchscript")
    with pytest.raises(PackError, match="built for x86_64"):
        pack_bundle(bundle, keypair[0], tmp_path / "t.edgebundle", arch="aarch64")


def _package_manifest(package_dir: Path, files: dict[str, bytes]) -> None:
    """A valid package manifest in ``package_dir`` listing ``files`` (name -> content) for two engines:
    onnxruntime reads model.onnx, torchscript model.ts; the tokenizer is both's."""
    from edge.preload.manifest import manifest_digest, model_digest

    entries = {n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in files.items()}
    hashes = {n: e["sha256"] for n, e in entries.items()}
    data = {"format_version": 1, "name": "fake", "model_sha256": model_digest(hashes),
            "tokenizer_sha256": hashes["tokenizer.fb"], "files": entries, "inputs": [], "outputs": [],
            "output_dim": 4, "max_seq_length": 16, "pooling": "mean", "normalize": True, "vocab_size": 32,
            "engines": {"onnxruntime": {"files": ["model.onnx"]}, "torchscript": {"files": ["model.ts"]}},
            "serving": {}, "source": {}, "tool_versions": {}}
    data["package_sha256"] = manifest_digest(data)
    (package_dir / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("with_other_engine", [False, True], ids=["own_files_only", "other_engine_file"])
def test_a_package_holding_another_engines_file_is_refused(tmp_path, keypair, with_other_engine):
    """A bundle built before the builder copied one engine's share: refused, naming the file."""
    bundle = make_bundle(tmp_path / "bundle")
    package_dir = bundle / "rootfs/opt/edge/package"
    files = {"model.onnx": (package_dir / "model.onnx").read_bytes(), "tokenizer.fb": b"tok", "model.ts": b"ts"}
    _package_manifest(package_dir, files)
    (package_dir / "tokenizer.fb").write_bytes(files["tokenizer.fb"])
    if with_other_engine:
        (package_dir / "model.ts").write_bytes(files["model.ts"])
    seal(bundle)
    out = tmp_path / "t.edgebundle"
    if not with_other_engine:
        pack_bundle(bundle, keypair[0], out)
        names = {e.path.rsplit("/", 1)[-1] for e in verify_archive(out, keypair[1].parent).files}
        assert {"manifest.json", "model.onnx", "tokenizer.fb"} <= names and "model.ts" not in names
        return
    with pytest.raises(PackError) as info:
        pack_bundle(bundle, keypair[0], out)
    assert "model.ts" in str(info.value) and "onnxruntime" in str(info.value) and "edge-bundle build" in str(info.value)
    assert not out.exists()


# ------------------------------------------------------------------ refused at pack


@pytest.mark.parametrize("links", [
    {"rootfs/etc/up": "../../../etc/shadow"},  # climbs out of the rootfs
    {"edge.service.d/abs": "/etc/shadow"},  # absolute outside the rootfs: the host's
    # usr/lib64/top/.. is inside the rootfs as text, but top is the rootfs itself: its .. is above
    {"rootfs/usr/lib64/top": "../..", "rootfs/x": "usr/lib64/top/.."},
])
def test_pack_refuses_a_symlink_leaving_the_bundle(tmp_path, bundle, keypair, links):
    for where, target in links.items():
        os.symlink(target, bundle / where)
    seal(bundle)
    with pytest.raises(PackError, match="no symlink out of the bundle"):
        pack_bundle(bundle, keypair[0], tmp_path / "x.edgebundle")
    assert not (tmp_path / "x.edgebundle").exists() and not (tmp_path / "x.edgebundle.tmp").exists()


def test_pack_refuses_a_fifo_and_setuid(tmp_path, bundle, keypair):
    os.mkfifo(bundle / "rootfs/tmp/fifo")
    with pytest.raises(PackError, match="fifo"):
        pack_bundle(bundle, keypair[0], tmp_path / "x.edgebundle")
    os.unlink(bundle / "rootfs/tmp/fifo")
    os.chmod(bundle / "rootfs/usr/bin/python3", 0o4755)
    with pytest.raises(PackError, match="setuid"):
        pack_bundle(bundle, keypair[0], tmp_path / "x.edgebundle")


def test_pack_refuses_a_bundle_edited_after_its_build(tmp_path, bundle, keypair):
    (bundle / "rootfs/etc/empty").write_bytes(b"edited")
    with pytest.raises(PackError, match="digest"):
        pack_bundle(bundle, keypair[0], tmp_path / "x.edgebundle")


# ------------------------------------------------------------------ refused at verify


@pytest.mark.parametrize("at", ["magic", "header", "middle", "last-block", "checksum"])
def test_a_flipped_byte_of_the_file_is_refused(tmp_path, packed, keypair, at):
    data = packed.read_bytes()
    pos = {"magic": 1, "header": 5, "middle": len(data) // 2, "last-block": len(data) - 9,
           "checksum": len(data) - 1}[at]
    bad = tmp_path / "bad.edgebundle"
    bad.write_bytes(_flip(data, pos))
    with pytest.raises(ArchiveError):
        verify_archive(bad, keypair[1].parent)


@pytest.mark.parametrize("what", ["manifest", "signature", "file data", "tar header", "after the end"])
def test_a_flipped_byte_inside_the_stream_is_refused(tmp_path, packed, keypair, what):
    tar = _tar_of(packed)
    members = _offsets(tar)
    big = members["bundle/rootfs/opt/edge/package/model.onnx"]
    pos = {"manifest": members[MANIFEST_MEMBER].offset_data + 40,
           "signature": members[SIGNATURE_MEMBER].offset_data + 10,
           "file data": big.offset_data + big.size // 2,
           "tar header": big.offset + 100,  # the mode field
           "after the end": len(tar) - 10}[what]
    expected = {"manifest": SignatureError, "signature": SignatureError, "file data": MemberError,
                "tar header": MemberError, "after the end": MemberError}[what]
    _repack(tar, tmp_path / "ok.edgebundle")
    verify_archive(tmp_path / "ok.edgebundle", keypair[1].parent)  # the repacking alone changes nothing
    with pytest.raises(expected) as info:
        verify_archive(_repack(_flip(tar, pos), tmp_path / "bad.edgebundle"), keypair[1].parent)
    if what == "file data":
        assert info.value.path == big.name and "sha256" in str(info.value)
    if what == "tar header":  # tarfile reads a header whose checksum fails as the end; we tell them apart
        assert info.value.path == big.name and "damaged tar header" in str(info.value)


def test_truncated_or_extended_archives_are_refused(tmp_path, packed, keypair):
    data = packed.read_bytes()
    for name, blob in [("cut-end", data[:-1]), ("cut-half", data[:len(data) // 2]), ("appended", data + b"\0"),
                       ("two frames", data + data)]:
        bad = tmp_path / f"{name}.edgebundle"
        bad.write_bytes(blob)
        with pytest.raises(MemberError):
            verify_archive(bad, keypair[1].parent)


def test_another_key_is_refused(tmp_path, packed):
    keys.keygen(tmp_path / "other")
    with pytest.raises(SignatureError, match="no trusted key"):
        verify_archive(packed, tmp_path / "other")


def test_a_member_missing_from_the_manifest_order_is_refused(tmp_path, packed, keypair):
    """Members come in the manifest's order: a valid tar with one member dropped is refused."""
    tar = _tar_of(packed)
    with tarfile.open(fileobj=io.BytesIO(tar)) as src:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
            for m in src.getmembers():
                if m.name != "bundle/rootfs/etc/empty":
                    dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    with pytest.raises(MemberError, match="bundle/rootfs/etc/empty"):
        verify_archive(_repack(buf.getvalue(), tmp_path / "bad.edgebundle"), keypair[1].parent)


# ------------------------------------------------------------------ the manifest model


def _manifest(**change) -> dict:
    files = [{"path": "bundle", "type": "dir", "mode": 0o755},
             {"path": "bundle/rootfs", "type": "dir", "mode": 0o755},
             {"path": "bundle/rootfs/lib64", "type": "symlink", "target": "usr/lib64"},
             {"path": "bundle/config.json", "type": "file", "mode": 0o644, "size": 3, "sha256": "c" * 64,
              "mtime": MTIME}]
    m = {"format": 1, "created": "2026-12-01T03:40:00+00:00", "edge_version": "0.1.0", "key_id": "0123456789abcdef",
         "bundle_sha256": "d" * 64, "engine": "onnxruntime",
         "package": {"name": "p", "package_sha256": "a" * 64, "model_sha256": "b" * 64, "tokenizer_sha256": None},
         "compatible": {"arch": "aarch64", "l4t": {"min": "36.0", "max": "36.99"}, "devices": []},
         "unpacked_bytes": 3, "files": files}
    for key, value in change.items():
        if key.startswith("file"):
            files.append(value)
        else:
            m[key] = value
    return m


def test_the_model_accepts_the_spec_example_and_round_trips():
    m = parse_manifest(json.dumps(_manifest()).encode())
    assert isinstance(m, Manifest) and parse_manifest(m.to_json()) == m


@pytest.mark.parametrize("entry,words", [
    ({"path": "bundle/../etc/passwd", "type": "file", "mode": 420, "size": 0, "sha256": "0" * 64, "mtime": 0}, "'..'"),
    ({"path": "/etc/passwd", "type": "file", "mode": 420, "size": 0, "sha256": "0" * 64, "mtime": 0}, "absolute"),
    ({"path": "etc/passwd", "type": "dir", "mode": 493}, "not under bundle/"),
    ({"path": "bundle/a\x00b", "type": "dir", "mode": 493}, "NUL"),
    ({"path": "bundle/rootfs/x", "type": "symlink", "target": "../../../etc"}, "leaves bundle/rootfs/"),
    ({"path": "bundle/rootfs/x", "type": "symlink", "target": "lib64/../../.."}, "leaves bundle/rootfs/"),
    ({"path": "bundle/x", "type": "symlink", "target": "/etc"}, "absolute target"),
    ({"path": "bundle/rootfs/lib64/x", "type": "dir", "mode": 493}, "not an earlier directory"),
    ({"path": "bundle/rootfs/s", "type": "file", "mode": 0o4755, "size": 0, "sha256": "0" * 64, "mtime": 0}, "setuid"),
    ({"path": "bundle/rootfs", "type": "dir", "mode": 493}, "listed twice"),
    ({"path": "bundle/f", "type": "file", "mode": 420, "size": 0, "sha256": "XYZ", "mtime": 0}, "sha256"),
    ({"path": "bundle/f", "type": "fifo", "mode": 420}, "type"),
])
def test_the_model_refuses_bad_entries_naming_the_field(entry, words):
    with pytest.raises(ManifestError, match="files") as info:
        parse_manifest(json.dumps(_manifest(file=entry)).encode())
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("change,field", [
    ({"format": 2}, "format"), ({"unpacked_bytes": 4}, "unpacked_bytes"), ({"key_id": "XYZ"}, "key_id"),
    ({"compatible": {"arch": "aarch64", "l4t": {"min": "37", "max": "36.99"}, "devices": []}}, "compatible.l4t"),
    ({"created": "2026-12-01T03:40:00"}, "created"), ({"surprise": 1}, "surprise"), ({"engine": "tensorrt"}, "engine"),
    ({"unpacked_bytes": "3"}, "unpacked_bytes"),  # strict: no string for a number
])
def test_the_model_refuses_bad_fields_naming_them(change, field):
    with pytest.raises(ManifestError) as info:
        parse_manifest(json.dumps(_manifest(**change)).encode())
    assert field in str(info.value), str(info.value)


def test_the_manifest_module_needs_no_cryptography():
    """The installer imports it before anything is verified: pydantic only."""
    import subprocess
    import sys

    code = ("import sys; import edge.update.archive.manifest; "
            "print(sorted(m for m in ('cryptography', 'zstandard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------ the command line


def test_cli_keygen_pack_verify_and_exit_statuses(tmp_path, bundle, capsys):
    from image.build_bundle import main

    assert main(["keygen", "--out", str(tmp_path / "k")]) == 0
    assert main(["keygen", "--out", str(tmp_path / "k")]) == 2
    out = tmp_path / "b.edgebundle"
    args = ["pack", "--bundle", str(bundle), "--key", str(tmp_path / "k/edge-signing.key"), "--out", str(out),
            "--quiet", "--device-compatible", "nvidia,p3768-0000+p3767-0005"]
    assert main(args) == 0
    record = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert record["archive_bytes"] == out.stat().st_size and record["compatible"]["devices"]
    assert main(args) == 2  # exists
    assert main([*args, "--force", "--engine", "torchscript"]) == 2
    assert main(["verify-archive", str(out), "--keys", str(tmp_path / "k")]) == 0
    out.write_bytes(_flip(out.read_bytes(), out.stat().st_size // 2))
    assert main(["verify-archive", str(out), "--keys", str(tmp_path / "k")]) == 1
    assert main(["verify-archive", str(out), "--keys", str(tmp_path / "nokeys")]) == 2


# ------------------------------------------------------------------ the real bundle


def test_the_real_ort_bundle_packs_and_verifies(tmp_path, ort_bundle, keypair):
    result = pack_bundle(ort_bundle, keypair[0], tmp_path / "ort.edgebundle")
    m = verify_archive(result.path, keypair[1].parent)
    assert m.engine == "onnxruntime" and m.unpacked_bytes > 250e6
    assert result.archive_bytes < 0.5 * m.unpacked_bytes  # the weights' copies match within the window
    names = {e.path.rsplit("/", 1)[-1] for e in m.files if e.path.startswith("bundle/rootfs/opt/edge/package/")}
    assert names == {"manifest.json", "model.ort", "model.onnx", "tokenizer.fb"}  # no TorchScript files
