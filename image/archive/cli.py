"""``edge-bundle keygen | pack | verify-archive``: the build host's side of bundle archives
(docs/archive.md). Building the parsers imports nothing of cryptography, pydantic or
zstandard; a command that runs without them says which extra to install.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

from edge.config.command_line import exit_epilog, fail

__all__ = ["COMMANDS", "EXIT_CODES", "add_parsers", "command"]

COMMANDS = ("keygen", "pack", "verify-archive")
EXIT_CODES = {
    0: "success (verify-archive: the signature, the manifest and every member check out)",
    1: "refused: pack: the bundle cannot be packed (a fifo or device node, a symlink out of the bundle, "
       "files that no longer match the bundle's digest, a file changed while packing); verify-archive: the "
       "signature, the manifest or a member does not check out (each message names which)",
    2: "usage error, or unusable input: not a bundle, --out exists (without --force), a key file that is "
       "missing, not Ed25519 or open to others, --engine/--arch other than the bundle's, no trusted key",
    3: "failed: reading or writing a file (nothing is left at --out: the .tmp file is removed), or the "
       "archive extra is not installed",
    130: "interrupted (Ctrl-C): nothing was written",
    143: "terminated (SIGTERM): nothing was written",
}
_EPILOG = exit_epilog(EXIT_CODES)
_EXTRA = "pip install 'edge[archive]' (cryptography, pydantic, zstandard)"


def add_parsers(sub) -> None:
    """The three subcommands, on ``edge-bundle``'s subparsers (their exit statuses are their own)."""
    k = sub.add_parser("keygen", epilog=_EPILOG,
                       help="write an Ed25519 key pair: DIR/edge-signing.key (0600) and DIR/edge-signing.pub")
    k.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="directory for the key pair (created 0700; an existing one must not be open to others)")
    k.add_argument("--force", action="store_true", help="replace a key pair already in DIR")

    p = sub.add_parser("pack", epilog=_EPILOG,
                       help="write a signed, compressed archive of a bundle (FILE.edgebundle) for edge-bundle install")
    p.add_argument("--bundle", required=True, type=Path, metavar="DIR", help="the bundle (edge-bundle build --out)")
    p.add_argument("--key", required=True, type=Path, metavar="KEY", help="the private key (edge-bundle keygen)")
    p.add_argument("--out", required=True, type=Path, metavar="FILE", help="the archive to write (NAME.edgebundle)")
    p.add_argument("--engine", choices=("onnxruntime", "torchscript"), default=None,
                   help="check that the bundle runs this engine (default: the bundle's, recorded in the manifest)")
    p.add_argument("--arch", default=None, help="check that the bundle is built for this uname -m (default: its own)")
    p.add_argument("--l4t-min", default=None, metavar="VERSION",
                   help="lowest L4T release the device may run, e.g. 36.0 (/etc/nv_tegra_release; default: any)")
    p.add_argument("--l4t-max", default=None, metavar="VERSION", help="highest L4T release, e.g. 36.99 (default: any)")
    p.add_argument("--device-compatible", action="append", default=None, metavar="STRING",
                   help="a /proc/device-tree/compatible entry the device must have one of, e.g. "
                        "nvidia,p3768-0000+p3767-0005 (repeatable; default: any device)")
    p.add_argument("--compression", choices=("zstd", "xz"), default="zstd",
                   help="zstd (default: 25x faster to unpack than xz, same size; docs/archive.md) or xz")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")

    v = sub.add_parser("verify-archive", epilog=_EPILOG,
                       help="check an archive's signature and every member in one pass, writing nothing")
    v.add_argument("file", type=Path, metavar="FILE", help="the archive (edge-bundle pack --out)")
    v.add_argument("--keys", required=True, type=Path, metavar="DIR", help="directory of trusted public keys (*.pub)")
    v.add_argument("--json", action="store_true", help="print the result as JSON")


def _fail(command: str, message: str, code: int) -> int:
    return fail(f"edge-bundle {command}", message, code)


def command(args) -> int:
    """Run ``args.command`` (one of :data:`COMMANDS`); its exit status (:data:`EXIT_CODES`)."""
    needed = ["cryptography", "pydantic"] + (["zstandard"] if getattr(args, "compression", None) == "zstd" else [])
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    if missing:
        return _fail(args.command, f"{', '.join(missing)} missing: {_EXTRA}", 3)
    from edge.update.archive import errors

    try:
        if args.command == "keygen":
            return _keygen(args)
        if args.command == "pack":
            return _pack(args)
        return _verify(args)
    except errors.KeyFileError as exc:
        return _fail(args.command, str(exc), 2)
    except errors.ArchiveError as exc:
        return _fail(args.command, str(exc), 1)
    except ImportError as exc:  # zstandard, for a zstd archive
        return _fail(args.command, f"{exc.name} is missing: {_EXTRA}", 3)
    except OSError as exc:
        return _fail(args.command, f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), 3)


def _keygen(args) -> int:
    from edge.update.archive.keys import keygen

    private, public, kid = keygen(args.out, force=args.force)
    print(f"key {kid}: private {private} (0600: keep it on the build host), public {public} "
          f"(copy it to ROOT/etc/edge/keys/ on each device)")
    return 0


def _pack(args) -> int:
    from edge.update.archive.errors import PackError
    from edge.update.archive.keys import load_private
    from image.archive.pack import check_request, pack_bundle
    from image.bundle.progress import Progress
    from image.cli_checks import writable_dir_problem

    if not args.bundle.is_dir():
        return _fail("pack", f"--bundle {args.bundle}: no such directory; make one with `edge-bundle build --out DIR`",
                     2)
    try:  # the mistakes of the command line, before the minute of hashing and compressing
        check_request(args.bundle, args.out, engine=args.engine, arch=args.arch, force=args.force)
        load_private(args.key)
    except PackError as exc:
        return _fail("pack", str(exc), 2)
    problem = writable_dir_problem(args.out)
    if problem:
        return _fail("pack", problem, 2)
    result = pack_bundle(args.bundle, args.key, args.out, engine=args.engine, arch=args.arch, l4t_min=args.l4t_min,
                         l4t_max=args.l4t_max, devices=args.device_compatible, compression=args.compression,
                         force=args.force, progress=Progress(quiet=args.quiet))
    m = result.manifest
    print(json.dumps({
        "archive": str(result.path), "archive_bytes": result.archive_bytes, "unpacked_bytes": result.unpacked_bytes,
        "ratio": round(result.archive_bytes / max(result.unpacked_bytes, 1), 4), "entries": result.entries,
        "compression": result.compression, "key_id": result.key_id, "bundle_sha256": m.bundle_sha256,
        "engine": m.engine, "compatible": m.compatible.model_dump(),
        "seconds": {"hash": round(result.hash_s, 2), "digest": round(result.digest_s, 2),
                    "write": round(result.write_s, 2)},
    }, indent=2))
    return 0


def _verify(args) -> int:
    from edge.update.archive.keys import load_trusted
    from edge.update.archive.verify import verify_archive

    if not args.file.is_file():
        return _fail("verify-archive", f"{args.file}: no such file; give an archive (edge-bundle pack --out)", 2)
    trusted = load_trusted(args.keys)
    t0 = time.monotonic()
    m = verify_archive(args.file, trusted)
    seconds = time.monotonic() - t0
    record = {"archive": str(args.file), "key_id": m.key_id, "bundle_sha256": m.bundle_sha256, "engine": m.engine,
              "entries": len(m.files), "unpacked_bytes": m.unpacked_bytes, "archive_bytes": args.file.stat().st_size,
              "seconds": round(seconds, 3), "unpacked_mb_per_s": round(m.unpacked_bytes / 1e6 / max(seconds, 1e-9), 1)}
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print(f"{args.file}: signed by {m.key_id}, {len(m.files)} entries, {m.unpacked_bytes / 1e6:.1f} MB "
              f"unpacked, every member as the manifest says ({seconds:.2f} s, "
              f"{record['unpacked_mb_per_s']} MB/s); bundle {m.bundle_sha256[:16]}..., {m.engine}")
    return 0
