"""Measure archives of real bundles: the figures of docs/archive.md ("Which compression and why",
"Sizes").

    python -c 'from image.archive.measure import run; run(["DIR", ...], codecs=["zstd:9", "xz:6"],
                                                          split_engines=True, runs=3, json_path="FILE")'

For each bundle and codec (single-threaded, as a Jetson would pack and unpack): the archive's
size, the time to write it, the time to decompress it (the installer's reader, nothing else),
and ``verify_archive``'s time next to ``sha256sum`` of the same uncompressed tar stream (read
from the page cache) and hashlib's sha256 of it. ``split_engines`` also packs each bundle
without the other engine's package files: what a bundle built before bundles carried one
engine's files (docs/archive.md, "Engines") would save; a bundle built now has none to leave out. Minimum and
median of ``runs`` for the reads; one run of each write (xz takes minutes).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge.update.archive import keys
from edge.update.archive.compression import DecompressingReader
from edge.update.archive.manifest import Compatible
from edge.update.archive.verify import verify_archive
from image.archive.pack import bundle_metadata, make_manifest, package_identity, scan_bundle, write_archive
from image.bundle.rootfs import PACKAGE_PATH

__all__ = ["measure", "run"]


def _times(fn, runs: int) -> dict:
    seconds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t0)
    return {"min_s": round(min(seconds), 3), "median_s": round(statistics.median(seconds), 3)}


def _decompress(path: Path, sink=None) -> int:
    with open(path, "rb") as f:
        r = DecompressingReader(f)
        while data := r.read(1 << 20):
            if sink is not None:
                sink.write(data)
        r.finish()
        return r.decompressed_bytes


def _hashlib_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _other_engine_files(bundle: Path, engine: str) -> set[str]:
    """Archive paths of the package files ``engine`` never reads (CPU or GPU)."""
    pkg = bundle / "rootfs" / PACKAGE_PATH.lstrip("/")
    m = json.loads((pkg / "manifest.json").read_text())
    spec = m["engines"][engine]
    keep = {"manifest.json", "tokenizer.fb", *spec.get("files", ()), *spec.get("gpu_files", ())}
    return {f"bundle/rootfs{PACKAGE_PATH}/{name}" for name in m["files"] if name not in keep}


def measure(bundle: Path, codecs: list[tuple[str, int]], runs: int, split: bool, work: Path) -> list[dict]:
    meta = bundle_metadata(bundle)
    entries, host, hash_s = scan_bundle(bundle)
    private = Ed25519PrivateKey.generate()
    trusted = {keys.key_id(private.public_key()): private.public_key()}
    kid = next(iter(trusted))
    variants = [("all files", entries)]
    if split:
        drop = _other_engine_files(bundle, meta["engine"])
        variants.append((f"{meta['engine']} files only", [e for e in entries if e.path not in drop]))
    records = []
    for label, chosen in variants:
        manifest = make_manifest(meta, chosen, kid, Compatible(arch=meta["arch"], l4t=None, devices=[]),
                                 package_identity(meta))
        signature = keys.sign(private, manifest.to_json())
        for kind, level in codecs:
            out = work / f"{bundle.name}-{kind}{level}.edgebundle"
            write_s = write_archive(out, manifest, signature, host, compression=kind, level=level)
            tar = work / "stream.tar"
            with open(tar, "wb") as f:
                tar_bytes = _decompress(out, f)
            record = {
                "bundle": str(bundle), "engine": meta["engine"], "files": label, "codec": f"{kind}:{level}",
                "unpacked_bytes": manifest.unpacked_bytes, "tar_bytes": tar_bytes,
                "archive_bytes": out.stat().st_size, "hash_s": round(hash_s, 3), "write_s": round(write_s, 2),
                "decompress": _times(lambda out=out: _decompress(out), runs),
                "verify_archive": _times(lambda out=out: verify_archive(out, trusted), runs),
                "sha256sum_tar": _times(lambda tar=tar: subprocess.run(["sha256sum", str(tar)], check=True,
                                                               capture_output=True), runs),
                "hashlib_sha256_tar": _times(lambda tar=tar: _hashlib_sha256(tar), runs),
            }
            mb = tar_bytes / 1e6
            for k in ("decompress", "verify_archive", "sha256sum_tar", "hashlib_sha256_tar"):
                record[k]["mb_per_s"] = round(mb / record[k]["median_s"], 1)
            os.unlink(tar)
            os.unlink(out)
            print(f"{bundle.name} {meta['engine']} [{label}] {kind}:{level}: {record['archive_bytes'] / 1e6:.1f} MB "
                  f"of {manifest.unpacked_bytes / 1e6:.1f} MB, write {write_s:.1f} s, decompress "
                  f"{record['decompress']['median_s']} s, verify {record['verify_archive']['median_s']} s "
                  f"({record['verify_archive']['mb_per_s']} MB/s), sha256sum {record['sha256sum_tar']['median_s']} s "
                  f"({record['sha256sum_tar']['mb_per_s']} MB/s)", flush=True)
            records.append(record)
    return records


def _codec(text: str) -> tuple[str, int]:
    kind, _, level = text.partition(":")
    if kind not in ("zstd", "xz") or not level.isdigit():
        raise ValueError(f"{text!r}: give zstd:LEVEL or xz:PRESET, e.g. zstd:9")
    return kind, int(level)


def run(bundles: list[str | Path], codecs: list[str] = ("zstd:9",), split_engines: bool = False, runs: int = 3,
        json_path: str | Path | None = None) -> list[dict]:
    """Measure each bundle with each codec (see the module docstring); the records, also written
    to ``json_path`` when given. One summary line per archive on stdout."""
    records = []
    with tempfile.TemporaryDirectory(prefix="edge-archive-measure-") as work:
        for bundle in bundles:
            records += measure(Path(bundle), [_codec(c) for c in codecs], runs, split_engines, Path(work))
    if json_path:
        Path(json_path).write_text(json.dumps(records, indent=2) + "\n")
    return records
