"""The bundle as an OCI image: ``edge-bundle image --bundle DIR [--bundle DIR2] --out LAYOUT``.

Writes an OCI image layout (image-spec 1.1: ``oci-layout``, ``index.json``, ``blobs/sha256/``)
with, per bundle, one gzip-compressed layer of its ``rootfs/``, an image config and a manifest.
The image config carries the bundle's ``process``: ``Entrypoint``/``Cmd`` from ``args``,
``Env``, ``User`` (``uid:gid``), ``WorkingDir``, and labels naming what it runs
(``com.edge.*`` and the ``org.opencontainers.image.*`` annotations). The bundle's mounts (the
socket directory, the state directory, the tmpfs on ``/tmp``), its read-only root and its
limits are the engine's job: docs/fleet.md and deploy/ give them.

Reproducible: the same bundles give the same bytes, hence the same digests.

* the layer is written here with :mod:`tarfile` (PAX format): entries in sorted path order,
  the rootfs's numeric owners with empty user and group names, its modes, and every mtime set
  to ``SOURCE_DATE_EPOCH`` (default 0): the rootfs's byte code is ``unchecked-hash``, so no
  source time matters. Hard links are stored as regular files;
* gzip with ``mtime=0``, no file name, level :data:`GZIP_LEVEL` (the same zlib gives the same
  bytes);
* ``created`` is ``SOURCE_DATE_EPOCH`` (default 0), JSON is written with sorted keys.

Several bundles (one per architecture: ``edge-bundle.json``'s ``arch``, ``aarch64`` ->
``arm64``, ``x86_64`` -> ``amd64``) make a multi-architecture image: ``index.json`` then names
an image index (tag ``TAG``) listing one manifest per platform. With one bundle ``TAG`` names
its manifest. Every manifest is also tagged ``TAG-ARCH`` (``latest-arm64``), which is what
``umoci unpack --image LAYOUT:TAG`` needs on a multi-architecture layout.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import tarfile
import time
from pathlib import Path

__all__ = ["ImageError", "build_image", "write_layer", "image_config", "add_parser", "command",
           "GZIP_LEVEL", "PLATFORMS", "MEDIA"]

GZIP_LEVEL = 6
PLATFORMS = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "amd64": "amd64"}
MEDIA = {
    "index": "application/vnd.oci.image.index.v1+json",
    "manifest": "application/vnd.oci.image.manifest.v1+json",
    "config": "application/vnd.oci.image.config.v1+json",
    "layer": "application/vnd.oci.image.layer.v1.tar+gzip",
}
REF = "org.opencontainers.image.ref.name"
_CHUNK = 1 << 20


class ImageError(Exception):
    """A bundle that cannot become an image, or an output that cannot be written."""


def _epoch() -> int:
    value = os.environ.get("SOURCE_DATE_EPOCH", "0")
    try:
        return int(value)
    except ValueError:
        raise ImageError(f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds") from None


def _rfc3339(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


class _Hashing:
    """A write-only file that hashes and counts what passes through it, then hands it on."""

    def __init__(self, sink) -> None:
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        if self.sink is not None:
            self.sink.write(data)
        return len(data)

    def flush(self) -> None:
        pass


def _entries(rootfs: Path):
    """Every path under ``rootfs`` (relative, ``/``-separated), sorted."""
    out = []
    for top, dirs, files in os.walk(rootfs):
        for name in dirs + files:
            out.append(os.path.relpath(os.path.join(top, name), rootfs))
    return sorted(out)


def _tarinfo(rootfs: Path, rel: str, epoch: int) -> tuple[tarfile.TarInfo, Path | None]:
    path = rootfs / rel
    st = path.lstat()
    info = tarfile.TarInfo(rel)
    info.mode, info.uid, info.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = epoch  # the rootfs's byte code is unchecked-hash (image/bundle/rootfs.py): no source time matters
    if stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
        return info, None
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        return info, None
    if stat.S_ISREG(st.st_mode):
        info.type, info.size = tarfile.REGTYPE, st.st_size
        return info, path
    raise ImageError(f"{path}: not a file, directory or symlink; a traced rootfs has none")


def write_layer(rootfs: Path, blob: Path, level: int = GZIP_LEVEL) -> dict:
    """``rootfs`` as a gzip-compressed tar at ``blob``: its digest, size, diff_id, uncompressed
    size and entry count."""
    epoch = _epoch()
    with open(blob, "wb") as raw:
        compressed = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=compressed, mtime=0) as gz:
            plain = _Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
                names = _entries(rootfs)
                for rel in names:
                    info, path = _tarinfo(rootfs, rel, epoch)
                    if path is None:
                        tar.addfile(info)
                    else:
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
    return {"digest": f"sha256:{compressed.sha.hexdigest()}", "size": compressed.size,
            "diff_id": f"sha256:{plain.sha.hexdigest()}", "uncompressed_size": plain.size, "entries": len(names)}


def _split_args(args: list[str]) -> tuple[list[str], list[str]]:
    """Entrypoint (the interpreter up to ``-m edge.boot``) and Cmd (the runtime's flags, which a
    runner may replace); all of ``args`` as the entrypoint when there is no ``-m edge.boot``."""
    for i in range(len(args) - 1):
        if args[i] == "-m" and args[i + 1] == "edge.boot":
            return args[:i + 2], args[i + 2:]
    return list(args), []


def _compatible(meta: dict, devices: list[str] | None, l4t: str | None) -> str:
    parts = [f"arch={meta['arch']}"]
    if l4t:
        parts.append(f"l4t={l4t}")
    parts += [f"device={d}" for d in devices or []]
    return ";".join(parts)


def image_config(bundle: Path, *, created: str, diff_id: str, source: str | None = None,
                 devices: list[str] | None = None, l4t: str | None = None) -> tuple[dict, dict]:
    """The image config of ``bundle`` (whose layer has ``diff_id``), and the annotations its
    manifest carries."""
    from edge import __version__

    config = json.loads((bundle / "config.json").read_text())
    meta = json.loads((bundle / "edge-bundle.json").read_text())
    process = config["process"]
    env = list(process.get("env", []))
    revision = next((e.split("=", 1)[1] for e in env if e.startswith("EDGE_CODE_COMMIT=")), None)
    entrypoint, cmd = _split_args(process["args"])
    user = process.get("user", {})
    resources = config.get("linux", {}).get("resources", {})
    annotations = {
        "org.opencontainers.image.title": f"edge ({meta.get('engine')}, {meta.get('package', {}).get('name', '')})",
        "org.opencontainers.image.description": "edge inference runtime: an OCI bundle built by edge-bundle build",
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.vendor": "edge",
        **({"org.opencontainers.image.revision": revision} if revision else {}),
        **({"org.opencontainers.image.source": source} if source else {}),
    }
    package = meta.get("package", {})
    labels = {
        **annotations,
        "com.edge.version": __version__,
        "com.edge.bundle_sha256": meta["bundle_sha256"],
        "com.edge.package_sha256": package.get("package_sha256", ""),
        "com.edge.package_name": str(package.get("name", "")),
        "com.edge.engine": str(meta.get("engine", "")),
        "com.edge.arch": meta["arch"],
        "com.edge.compatible": _compatible(meta, devices, l4t),
        "com.edge.user": f"{user.get('uid', 0)}:{user.get('gid', 0)}",
        "com.edge.socket_dir": str(meta.get("container_socket_dir", "/run/edge")),
        "com.edge.address": str(meta.get("container_address", "")),
        "com.edge.state_dir": "/var/lib/edge/runtime",
        "com.edge.memory_limit": str(resources.get("memory", {}).get("limit", "")),
        "com.edge.pids_limit": str(resources.get("pids", {}).get("limit", "")),
        "com.edge.health": json.dumps(meta.get("health_probe") or []),
    }
    image = {
        "created": created,
        "architecture": PLATFORMS[meta["arch"]],
        "os": "linux",
        "config": {
            "User": f"{user.get('uid', 0)}:{user.get('gid', 0)}",
            "Env": env,
            "Entrypoint": entrypoint,
            **({"Cmd": cmd} if cmd else {}),
            "WorkingDir": process.get("cwd", "/"),
            "StopSignal": "SIGTERM",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": f"edge-bundle image (edge {__version__})",
                     "comment": f"bundle {meta['bundle_sha256']}"}],
    }
    if meta["arch"] in ("aarch64", "arm64"):
        image["variant"] = "v8"
    return image, annotations


def _canonical(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _put(blobs: Path, data: bytes, media: str, **extra) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data), **extra}


def _check_bundle(bundle: Path) -> dict:
    if not (bundle / "config.json").is_file() or not (bundle / "edge-bundle.json").is_file() \
            or not (bundle / "rootfs").is_dir():
        raise ImageError(f"{bundle} is not a bundle (no config.json, edge-bundle.json and rootfs/); "
                         f"make one with `edge-bundle build --out DIR`")
    meta = json.loads((bundle / "edge-bundle.json").read_text())
    config = json.loads((bundle / "config.json").read_text())
    hidden = [m["destination"] for m in config.get("mounts", [])
              if m.get("type") == "bind" and m["destination"].startswith("/tmp/")]
    if hidden:  # image/bundle/oci_config.py tmp_bind_mounts: an image cannot carry these binds
        raise ImageError(f"{bundle}: its environment lies under /tmp ({', '.join(hidden)}); every engine mounts "
                         f"a tmpfs on /tmp (podman --read-only, the DaemonSet's emptyDir), which would hide it. "
                         f"Build the bundle from an environment outside /tmp")
    if meta.get("arch") not in PLATFORMS:
        raise ImageError(f"{bundle}: architecture {meta.get('arch')!r} has no OCI platform here "
                         f"(known: {', '.join(sorted(PLATFORMS))})")
    return meta


def build_image(bundles: list[Path], out: Path, *, tag: str = "latest", source: str | None = None,
                devices: list[str] | None = None, l4t: str | None = None, force: bool = False,
                level: int = GZIP_LEVEL, say=lambda msg: None) -> dict:
    """Write the OCI image layout of ``bundles`` (one per architecture) at ``out``; a summary:
    the index digest (the tag's), and per platform the manifest digest and the layer's sizes."""
    out = Path(out)
    metas = [_check_bundle(Path(b)) for b in bundles]
    platforms = [PLATFORMS[m["arch"]] for m in metas]
    if len(set(platforms)) != len(platforms):
        raise ImageError(f"one bundle per architecture: {', '.join(platforms)}")
    if out.exists() and not force:
        raise ImageError(f"{out} exists; pass --force to replace it")
    stage = out.with_name(f".{out.name}.staging-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    blobs = stage / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    created = _rfc3339(_epoch())
    summary: dict = {"tag": tag, "created": created, "platforms": {}}
    descriptors = []
    try:
        for bundle, meta, platform in zip(bundles, metas, platforms):
            bundle = Path(bundle)
            start = time.monotonic()
            tmp = stage / "layer.tmp"
            layer = write_layer(bundle / "rootfs", tmp, level)
            tmp.rename(blobs / layer["digest"].split(":", 1)[1])
            config, annotations = image_config(bundle, created=created, diff_id=layer["diff_id"], source=source,
                                               devices=devices, l4t=l4t)
            config_desc = _put(blobs, _canonical(config), MEDIA["config"])
            manifest = {"schemaVersion": 2, "mediaType": MEDIA["manifest"], "config": config_desc,
                        "layers": [{"mediaType": MEDIA["layer"], "digest": layer["digest"], "size": layer["size"]}],
                        "annotations": annotations}
            plat = {"architecture": platform, "os": "linux", **({"variant": "v8"} if platform == "arm64" else {})}
            desc = _put(blobs, _canonical(manifest), MEDIA["manifest"], platform=plat)
            descriptors.append(desc)
            summary["platforms"][platform] = {
                "bundle": str(bundle.resolve()), "bundle_sha256": meta["bundle_sha256"], "manifest": desc["digest"],
                "config": config_desc["digest"], "layer": layer["digest"], "diff_id": layer["diff_id"],
                "compressed_bytes": layer["size"], "uncompressed_bytes": layer["uncompressed_size"],
                "entries": layer["entries"], "seconds": round(time.monotonic() - start, 2)}
            say(f"{platform}: layer {layer['size']:,} B gzip ({layer['uncompressed_size']:,} B tar), "
                f"manifest {desc['digest']}")
        tagged = [{**d, "annotations": {REF: f"{tag}-{d['platform']['architecture']}"}} for d in descriptors]
        if len(descriptors) == 1:
            top = {**descriptors[0], "annotations": {REF: tag}}
        else:
            nested = {"schemaVersion": 2, "mediaType": MEDIA["index"], "manifests": descriptors}
            top = {**_put(blobs, _canonical(nested), MEDIA["index"]), "annotations": {REF: tag}}
        index = {"schemaVersion": 2, "mediaType": MEDIA["index"], "manifests": [top, *tagged]}
        (stage / "index.json").write_bytes(_canonical(index))
        (stage / "oci-layout").write_bytes(_canonical({"imageLayoutVersion": "1.0.0"}))
        summary["digest"] = top["digest"]
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    summary["layout"] = str(out)
    return summary


def add_parser(sub, epilog: str) -> None:
    p = sub.add_parser("image", epilog=epilog,
                       help="write the bundle(s) as a reproducible OCI image layout for podman, skopeo, k3s "
                            "(docs/fleet.md)")
    p.add_argument("--bundle", required=True, type=Path, action="append", metavar="DIR",
                   help="a bundle (edge-bundle build --out); repeat with one bundle per architecture")
    p.add_argument("--out", required=True, type=Path, metavar="LAYOUT", help="the OCI image layout directory to write")
    p.add_argument("--tag", default="latest", help="the tag in index.json (org.opencontainers.image.ref.name)")
    p.add_argument("--source", default=None, metavar="URL", help="org.opencontainers.image.source (default: none)")
    p.add_argument("--device-compatible", action="append", default=None, metavar="STRING",
                   help="a /proc/device-tree/compatible entry for the com.edge.compatible label (repeatable)")
    p.add_argument("--l4t", default=None, metavar="RANGE", help="L4T releases for com.edge.compatible, e.g. 36.0-36.99")
    p.add_argument("--json", action="store_true", help="print the summary (digests, sizes) as JSON")
    p.add_argument("--force", action="store_true", help="replace LAYOUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def command(args) -> int:
    import sys

    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"edge-bundle image: {msg}", file=sys.stderr))
    try:
        summary = build_image(args.bundle, args.out, tag=args.tag, source=args.source,
                              devices=args.device_compatible, l4t=args.l4t, force=args.force, say=say)
    except ImageError as exc:
        print(f"edge-bundle image: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['layout']}:{summary['tag']} {summary['digest']}")
    return 0
