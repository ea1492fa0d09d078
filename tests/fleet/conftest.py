"""Fleet tests: the bundle as an OCI image (image/bundle/oci_image.py), the podman unit and the
k8s manifests of deploy/ (docs/fleet.md)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ort_image(ort_bundle):
    """(layout, summary): the OCI image of the onnxruntime bundle, cached (fleet_support)."""
    from support.bundles import REPO
    from fleet_support import cached_image

    if str(REPO).startswith("/tmp/"):  # oci_image refuses it: the engines' tmpfs on /tmp would hide the venv
        pytest.skip(f"the checkout {REPO} lies under /tmp: its bundle cannot become an image (docs/fleet.md)")
    return cached_image(ort_bundle)


@pytest.fixture(scope="session")
def ts_image(ts_bundle):
    """(layout, summary): the OCI image of the TorchScript bundle, cached (fleet_support)."""
    from support.bundles import REPO
    from fleet_support import cached_image

    if str(REPO).startswith("/tmp/"):  # as ort_image
        pytest.skip(f"the checkout {REPO} lies under /tmp: its bundle cannot become an image (docs/fleet.md)")
    return cached_image(ts_bundle)


@pytest.fixture(scope="session")
def arm64_bundle(minilm_package):
    """The onnxruntime bundle of the MiniLM package for aarch64, built on this host under qemu-user
    (``edge-bundle emulated``, image/bundle/emulated.py) and cached like ort_bundle; its Debian root
    in fleet_support.ARM64_ROOT, made once per machine (about 3.5 minutes)."""
    from fleet_support import cached_arm64_bundle

    yield from cached_arm64_bundle(minilm_package)


@pytest.fixture(scope="module")
def bundle_embeddings(ort_bundle, tmp_path_factory):
    """The bundle's own replies to fleet_support.TEXTS, under runc: what every engine must match."""
    from support.bundles import bundle_meta, prepare_socket_dir, private_bundle, start_container
    from fleet_support import embed

    work = tmp_path_factory.mktemp("ref")
    bundle = private_bundle(ort_bundle, work)
    meta = bundle_meta(bundle)
    prepare_socket_dir(meta)
    container = start_container(bundle, work, prefix="fleet-ref")
    try:
        container.wait_ready()
        return embed(meta["address"])
    finally:
        container.stop()
