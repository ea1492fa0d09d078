"""The model package in a bundle: its manifest, unchanged, and only the files the bundle's engine reads.

A package holds every engine's files (MiniLM: ``model.ort`` and ``model.onnx`` for ONNX Runtime,
``model.ts`` and ``weights.safetensors`` for TorchScript, ~90 MB each but ``model.ts``). A
bundle runs one engine, so :func:`copy_package` copies to ``/opt/edge/package``:

* ``manifest.json`` byte for byte: its ``package_sha256``, ``model_sha256`` and
  ``tokenizer_sha256`` still validate and still name the package in every reply's lineage;
* ``Manifest.files_of(engine)``: the tokenizer (and any file no engine claims) and the engine's
  ``files`` and ``gpu_files``. ONNX Runtime keeps both ``model.ort`` (the CPU's) and
  ``model.onnx`` (the GPU's: a Jetson runs it with the CUDA execution provider).

The runtime checks the same list at boot (``open_package(..., engine=E)`` in ``edge/boot.py``),
so what the bundle leaves out is exactly what its boot never asks for.

A package that names a fallback (the manifest's ``fallback``, ``edge/preload/fallback.py``) brings
what the breaker would load: a fallback package (``fallback/`` inside the package) is copied as
``fallback/NAME``, its manifest and the files of the fallback's engine only, after the same full
check a boot makes (a fallback whose engine files are missing or altered is refused, naming the
file); a fallback of kind ``device`` on another engine adds that engine's files of the package. The files the manifest
lists but the bundle does not carry are recorded in ``edge-bundle.json`` (``package.left_out``),
and the bundle's digest covers what is there. docs/bundle.md, "Build".
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from edge.preload.fallback_package import resolve_fallback
from edge.preload.manifest import MANIFEST_NAME, open_package
from image.bundle.rootfs import PACKAGE_PATH, Rootfs

__all__ = ["package_files", "copy_package", "package_identity"]


def package_files(package: Path, engine: str) -> tuple[list[str], list[str]]:
    """(the files of ``package`` a bundle of ``engine`` carries, manifest.json first; those it leaves out).

    Raises :class:`edge.errors.PackageError` when the package has no files for ``engine``, or one
    of them is missing, of another size or another sha256 than its manifest says: a bundle must
    not seal a package its boot would refuse. The same for the fallback's engine and files.
    """
    pkg = open_package(package, verify="full", engine=engine)
    pkg.engine_files(engine)  # refuses an engine the manifest does not name
    keep = pkg.manifest.files_of(engine)
    fallback = pkg.manifest.fallback
    if fallback is not None and fallback.kind == "device" and fallback.engine != engine:
        own = set(pkg.manifest.files_of(fallback.engine))
        pkg.verify_files(own - set(keep))
        keep = [n for n in pkg.manifest.files if n in own or n in keep]
    carried, left_out = [MANIFEST_NAME, *keep], [n for n in pkg.manifest.files if n not in keep]
    if fallback is not None and fallback.kind == "package":
        root, fb_engine, _ = resolve_fallback(pkg, verify="full")  # its pin, its engine's files, in full
        sub = open_package(root, verify="none").manifest
        own = sub.files_of(fb_engine)
        carried += [f"{fallback.path}/{n}" for n in (MANIFEST_NAME, *own)]
        left_out += [f"{fallback.path}/{n}" for n in sub.files if n not in own]
    return carried, left_out


def copy_package(rootfs: Rootfs, package: Path, files: list[str], progress=None) -> int:
    """Copy ``files`` of ``package`` (:func:`package_files`) to :data:`PACKAGE_PATH`, read-only
    (0444), flat but for a fallback package's ``DIR/NAME``; returns their bytes."""
    rootfs.mkdir(PACKAGE_PATH)
    nbytes = 0
    for i, name in enumerate(files, 1):
        if "/" in name:  # a fallback package's file: its directory first (0755, like the package's)
            rootfs.mkdir(f"{PACKAGE_PATH}/{name.rsplit('/', 1)[0]}")
        dest = rootfs.inside(PACKAGE_PATH) / name
        shutil.copyfile(Path(package) / name, dest)
        os.chmod(dest, 0o444)
        nbytes += dest.stat().st_size
        if progress:
            progress.count("copying model package", i, len(files), nbytes)
    return nbytes


def package_identity(package: Path) -> dict:
    """The package's name and hashes, from its manifest (``package`` in ``edge-bundle.json``)."""
    m = json.loads((Path(package) / MANIFEST_NAME).read_text())
    return {k: m.get(k) for k in ("name", "package_sha256", "model_sha256", "tokenizer_sha256")}
