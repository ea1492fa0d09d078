"""edge-bundle image: a reproducible OCI image layout, readable by skopeo, with the bundle's
process and labels (image/bundle/oci_image.py, docs/fleet.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from fleet_support import tool_or_skip

from image.bundle.oci_image import MEDIA, build_image


def _blob(layout, digest: str) -> dict:
    return json.loads((layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes())


def _small_bundle(src, out, arch: str | None = None, extra: bytes = b""):
    """A bundle with the real config.json and metadata and a tiny rootfs (two files, a link)."""
    (out / "rootfs" / "opt").mkdir(parents=True)
    (out / "rootfs" / "opt" / "a.py").write_text("print('a')\n")
    (out / "rootfs" / "opt" / "b.bin").write_bytes(b"\0b" + extra)
    (out / "rootfs" / "lib").symlink_to("opt")
    shutil.copyfile(src / "config.json", out / "config.json")
    meta = json.loads((src / "edge-bundle.json").read_text())
    if arch:
        meta["arch"] = arch
    (out / "edge-bundle.json").write_text(json.dumps(meta))
    return out


def test_two_builds_of_the_real_bundle_have_one_digest(ort_bundle, ort_image, tmp_path):
    layout, cached = ort_image
    again = build_image([ort_bundle], tmp_path / "layout")  # a second build, now, of the same bundle
    assert again["digest"] == cached["digest"]
    assert again["platforms"]["amd64"]["layer"] == cached["platforms"]["amd64"]["layer"]
    index = json.loads((layout / "index.json").read_text())
    assert (tmp_path / "layout" / "index.json").read_bytes() == (layout / "index.json").read_bytes()
    top = index["manifests"][0]
    assert top["digest"] == cached["digest"] and top["mediaType"] == MEDIA["manifest"]
    assert top["annotations"]["org.opencontainers.image.ref.name"] == "latest"
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    manifest = _blob(layout, top["digest"])
    config = _blob(layout, manifest["config"]["digest"])
    bundle_config = json.loads((ort_bundle / "config.json").read_text())["process"]
    assert config["config"]["Entrypoint"] + config["config"].get("Cmd", []) == bundle_config["args"]
    assert config["config"]["Env"] == bundle_config["env"]
    assert config["config"]["User"] == f"{bundle_config['user']['uid']}:{bundle_config['user']['gid']}"
    assert config["config"]["WorkingDir"] == bundle_config["cwd"]
    layer = layout / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":", 1)[1]
    assert layer.stat().st_size == manifest["layers"][0]["size"]
    print(f"\nimage of the onnxruntime bundle: {json.dumps(cached['platforms']['amd64'])}", file=sys.stderr)


def test_a_changed_bundle_gives_another_digest_and_the_same_one_again(ort_bundle, tmp_path):
    a = _small_bundle(ort_bundle, tmp_path / "a")
    b = _small_bundle(ort_bundle, tmp_path / "b")  # written later: other mtimes, same content
    c = _small_bundle(ort_bundle, tmp_path / "c", extra=b"!")
    da, db, dc = (build_image([x], tmp_path / f"{x.name}.oci")["digest"] for x in (a, b, c))
    assert da == db and dc != da


def test_skopeo_reads_the_layout_and_its_labels(ort_bundle, ort_image, tmp_path):
    skopeo = tool_or_skip("skopeo")
    layout, summary = ort_image
    meta = json.loads((ort_bundle / "edge-bundle.json").read_text())
    got = json.loads(subprocess.run([skopeo, "inspect", f"oci:{layout}:latest"], capture_output=True, text=True,
                                    check=True, timeout=60).stdout)
    labels = got["Labels"]
    assert got["Digest"] == summary["digest"] and got["Architecture"] == "amd64"
    assert labels["com.edge.bundle_sha256"] == meta["bundle_sha256"]
    assert labels["com.edge.package_sha256"] == meta["package"]["package_sha256"]
    assert labels["com.edge.compatible"].startswith(f"arch={meta['arch']}")
    from edge import __version__
    assert labels["com.edge.version"] == labels["org.opencontainers.image.version"] == __version__
    copied = subprocess.run([skopeo, "copy", f"oci:{layout}:latest", f"oci:{tmp_path / 'copy'}:x"],
                            capture_output=True, text=True, timeout=120)
    assert copied.returncode == 0, copied.stderr


def test_several_bundles_make_a_multi_architecture_index(ort_bundle, tmp_path):
    amd = _small_bundle(ort_bundle, tmp_path / "amd")
    arm = _small_bundle(ort_bundle, tmp_path / "arm", arch="aarch64")
    summary = build_image([arm, amd], tmp_path / "multi", tag="v1")
    layout = tmp_path / "multi"
    index = json.loads((layout / "index.json").read_text())
    refs = {d["annotations"]["org.opencontainers.image.ref.name"]: d for d in index["manifests"]}
    assert set(refs) == {"v1", "v1-arm64", "v1-amd64"}
    nested = _blob(layout, refs["v1"]["digest"])
    assert refs["v1"]["mediaType"] == nested["mediaType"] == MEDIA["index"]
    assert sorted(m["platform"]["architecture"] for m in nested["manifests"]) == ["amd64", "arm64"]
    assert _blob(layout, _blob(layout, refs["v1-arm64"]["digest"])["config"]["digest"])["architecture"] == "arm64"
    assert summary["platforms"]["arm64"]["manifest"] == refs["v1-arm64"]["digest"]
    skopeo = tool_or_skip("skopeo")
    raw = subprocess.run([skopeo, "inspect", "--raw", f"oci:{layout}:v1"], capture_output=True, text=True,
                         timeout=60)
    assert raw.returncode == 0 and json.loads(raw.stdout)["mediaType"] == MEDIA["index"], raw.stderr
    # what an engine on each kind of node resolves the one tag to: its platform's manifest and labels
    for arch, machine in (("arm64", "aarch64"), ("amd64", "x86_64")):
        got = subprocess.run([skopeo, "--override-arch", arch, "inspect", f"oci:{layout}:v1"], capture_output=True,
                             text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        seen = json.loads(got.stdout)
        assert seen["Architecture"] == arch and seen["Digest"] == summary["digest"], seen  # the tag's: the index
        assert seen["Labels"]["com.edge.arch"] == machine
        config = _blob(layout, _blob(layout, summary["platforms"][arch]["manifest"])["config"]["digest"])
        assert seen["Labels"] == config["config"]["Labels"]  # that platform's own image config


def test_a_bundle_whose_environment_lies_under_tmp_is_refused(ort_bundle, tmp_path):
    import pytest

    from image.bundle.oci_image import ImageError

    bundle = _small_bundle(ort_bundle, tmp_path / "b")
    config = json.loads((bundle / "config.json").read_text())
    config["mounts"].append({"destination": "/tmp/ci/.venv", "type": "bind", "source": "rootfs/tmp/ci/.venv",
                             "options": ["rbind", "ro"]})
    (bundle / "config.json").write_text(json.dumps(config))
    with pytest.raises(ImageError, match=r"lies under /tmp \(/tmp/ci/.venv\)"):
        build_image([bundle], tmp_path / "layout")
    assert not (tmp_path / "layout").exists()
