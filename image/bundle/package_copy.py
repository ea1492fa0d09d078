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
so what the bundle leaves out is exactly what its boot never asks for. The files the manifest
lists but the bundle does not carry are recorded in ``edge-bundle.json`` (``package.left_out``),
and the bundle's digest covers what is there. docs/bundle.md, "Build".
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from edge.preload.manifest import MANIFEST_NAME, open_package
from image.bundle.rootfs import PACKAGE_PATH, Rootfs

__all__ = ["package_files", "copy_package", "package_identity"]


def package_files(package: Path, engine: str) -> tuple[list[str], list[str]]:
    """(the files of ``package`` a bundle of ``engine`` carries, manifest.json first; those it leaves out).

    Raises :class:`edge.errors.PackageError` when the package has no files for ``engine``, or one
    of them is missing, of another size or another sha256 than its manifest says: a bundle must
    not seal a package its boot would refuse.
    """
    pkg = open_package(package, verify="full", engine=engine)
    pkg.engine_files(engine)  # refuses an engine the manifest does not name
    keep = pkg.manifest.files_of(engine)
    return [MANIFEST_NAME, *keep], [n for n in pkg.manifest.files if n not in keep]


def copy_package(rootfs: Rootfs, package: Path, files: list[str], progress=None) -> int:
    """Copy ``files`` of ``package`` (:func:`package_files`) to :data:`PACKAGE_PATH`, flat and
    read-only (0444); returns their bytes."""
    rootfs.mkdir(PACKAGE_PATH)
    nbytes = 0
    for i, name in enumerate(files, 1):
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
