"""Build an OCI runtime bundle of the runtime: ``config.json``, ``rootfs/`` and ``edge-bundle.json``.

    edge-bundle build --out DIR [--package DIR] [--engine onnxruntime|torchscript] [--cdi FILE]
                      [--socket-dir DIR] [--user UID:GID] [--arch ARCH] [--python PATH] [--tcp ADDR] [--metrics-dir DIR]
                      [--allow-dirty] [--wheel FILE]
    edge-bundle verify DIR

Steps (docs/bundle.md has the details):

1. check the target architecture against the environment's interpreter (ELF header);
2. build the device wheel from the commit (``image/bundle/wheel.py``; a tree that differs from
   HEAD is refused without ``--allow-dirty``) and install it in a work directory;
3. boot the runtime to READY from the wheel and the environment's dependencies under a tracer
   (``image/bundle/trace.py``), exercise it as a client, stop it; the files it imported, opened
   and mapped are the list;
4. copy those files to ``rootfs/``: the interpreter and the modules to the fixed paths of
   ``image/bundle/layout.py`` (``/opt/edge/python``, ``/opt/edge/lib``), system libraries at their
   paths; the model package's manifest, tokenizer and the engine's files to ``/opt/edge/package``
   (``image/bundle/package_copy.py``); write ``/etc/passwd``, byte-code, a loader cache;
5. write ``config.json`` (read-only root, tmpfs /tmp, the socket directory bind-mounted,
   non-root, no capabilities, seccomp, memory/pids/open-files limits derived from the sizes)
   and merge the CDI spec's GPU edits into it;
6. write ``edge-bundle.json`` (where to connect, sizes, limits, what was traced, hashes),
   ``rootfs.files`` and the unit's drop-in ``edge.service.d/limits.conf``, then rename the
   staging directory into place.

``verify`` checks that every file of ``rootfs.files`` is in the rootfs with its size and
names the ones that are not.

Reproducible: the same commit, package, engine and dependency versions give the same bundle
digest from any checkout and any environment, at any path: nothing in ``config.json``, the
rootfs or ``edge-bundle.json`` names the build host's checkout, environment, home or work
directories (the build checks the rootfs for them and records what it found in ``host_paths``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edge.config.command_line import UsageError, exit_epilog
from edge.errors import PackageError
from edge.runtime.launch import boot_argv
from image.bundle import cdi, metrics, oci_config, seccomp, wheel
from image.bundle.container_env import container_env, jemalloc_of, trace_env
from edge.config.argtypes import positive_int
from image.cli_checks import abs_dir, tcp_address, user_ids, writable_dir_problem
from image.bundle.digest import ENV_NAME as DIGEST_ENV
from image.bundle.digest import bundle_digest, config_digest_entry
from image.bundle.package_copy import copy_package, package_files, package_identity
from image.bundle.progress import Progress, human_bytes, stop_signals
from image.bundle.layout import PYTHON_HOME, SITE, Layout, host_private_roots, rewrite_host_paths
from image.bundle.rootfs import PACKAGE_PATH, Rootfs, elf_machine, select_files, tree_size
from image.bundle.limits import UNIT_DROPIN, resource_limits, unit_dropin
from image.bundle.trace import TraceError, trace_boot

__all__ = ["build_bundle", "verify_bundle", "BundleError", "main", "METADATA_NAME",
           "FILES_NAME", "BUNDLE_FORMAT"]

BUNDLE_FORMAT = 1
METADATA_NAME = "edge-bundle.json"
FILES_NAME = "rootfs.files"  # one "path<TAB>size" line per copied file, its path in the rootfs
SOCKET_NAME = "edge.sock"
DEFAULT_SOCKET_DIR = "/run/edge"
DEFAULT_USER = (61000, 61000)  # uid, gid of the runtime; the host group of that gid reaches the socket


class BundleError(RuntimeError):
    """The bundle cannot be built (or verified) as asked; the message says what to change."""


def check_arch(python: str, arch: str) -> str:
    """The interpreter's machine; raises when it is not ``arch``."""
    real = os.path.realpath(python)
    found = elf_machine(real)
    if found is None:
        raise BundleError(f"{real} is not an ELF executable; --python must be the environment's interpreter")
    if found != arch:
        raise BundleError(f"the environment's interpreter {real} is built for {found}, but the target is {arch}: "
                          f"build the bundle from an environment of the target's architecture "
                          f"(on the device, or a {arch} build host)")
    return found


def _site_dirs(python: str) -> list[str]:
    """The site-packages of ``python``'s environment (its dependencies): without ``-S``, which would
    not see a virtual environment."""
    code = "import sysconfig; print('\\n'.join(dict.fromkeys(sysconfig.get_path(k) for k in ('purelib', 'platlib'))))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if p and os.path.isdir(p)]


def _device_wheel(work: Path, wheel_file: Path | None, allow_dirty: bool) -> wheel.DeviceWheel:
    if wheel_file is not None:
        return wheel.read_wheel(wheel_file)
    repo = Path(__file__).resolve().parent.parent
    try:
        return wheel.build_device_wheel(repo, work / "wheel", allow_dirty=allow_dirty)
    except wheel.DirtyTree as exc:
        raise BundleError(str(exc)) from None


def _host_paths(rootfs: Rootfs, config: dict, private: list[str]) -> list[str]:
    """Rootfs files (and config.json) that still name a build-host directory of ``private``.

    A home directory is looked for as the paths of what it holds (``/root/.pyenv``): a bare
    ``/root`` is in PyPI wheels built in manylinux containers (``/root/usr/lib/gcc/...``),
    the same bytes on every build host."""
    home = os.path.expanduser("~")
    needles = []
    for root in private:
        if root == home and os.path.isdir(home):
            needles += [os.path.join(home, n) for n in sorted(os.listdir(home))]
        else:
            needles.append(root)
    text = json.dumps(config)
    found = [f"config.json: {n}" for n in needles if n in text]
    raw = [n.encode() for n in needles]
    for path in rootfs.copied:
        data = rootfs.inside(path).read_bytes()
        found += [f"{path}: {n.decode()}" for n in raw if n in data]
    return found


def _in_container(summary: dict, layout: Layout) -> dict:
    """The trace's summary with its paths as the container sees them (never the build host's)."""
    for key in ("dlopened", "executed"):
        summary[key] = sorted({layout.container_path(p) if os.path.isabs(p) else p for p in summary[key]})
    return summary


def build_bundle(out: Path, *, package: Path, engine: str = "onnxruntime", python: str | None = None,
                 cdi_spec: Path | None = None, cdi_devices: list[str] | None = None,
                 socket_dir: str = DEFAULT_SOCKET_DIR, user: tuple[int, int] = DEFAULT_USER, metrics_dir: str | None = None,
                 arch: str | None = None, tcp: str | None = None, threads: int | None = None,
                 use_strace: str = "auto", force: bool = False, progress: Progress | None = None,
                 state_dir: str = oci_config.STATE_DIR, allow_dirty: bool = False,
                 wheel_file: Path | None = None) -> dict:
    """Write the bundle to ``out``; returns the metadata written to ``edge-bundle.json``."""
    progress = progress or Progress(quiet=True)
    python = python or sys.executable
    arch = arch or platform.machine()
    check_arch(python, arch)
    out, package = Path(out).resolve(), Path(package).resolve()
    if out.exists() and not force:
        raise BundleError(f"{out} exists; pass --force to replace it")
    if not (package / "manifest.json").exists():
        raise BundleError(f"{package} is not a model package (no manifest.json); build one with edge-package build")
    try:  # before the minute of tracing
        carried, left_out = package_files(package, engine)
    except PackageError as exc:
        raise BundleError(f"--package {package} cannot make a bundle of {engine}: {exc}") from None
    edits = cdi.select_edits(cdi.load_spec(cdi_spec), cdi_devices) if cdi_spec else None
    device = "auto" if edits else "cpu"
    jemalloc = jemalloc_of(python)
    boot_args = ["--engine", engine]
    t0 = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    old = None  # a bundle --force replaces: moved aside, removed once the new one is in place
    try:
        with tempfile.TemporaryDirectory(prefix="edge-bundle-trace-") as work:
            work = Path(work)
            device_wheel = _device_wheel(work, wheel_file, allow_dirty)
            site = str(wheel.install_wheel(device_wheel.path, work / "site"))
            progress.done(f"device wheel {device_wheel.path.name} of {device_wheel.commit[:12]}"
                          f"{'-dirty' if device_wheel.dirty_sha256 else ''}, sha256 {device_wheel.sha256[:12]}")
            site_dirs = [site, *_site_dirs(python)]
            host_env = trace_env(python, site_dirs, threads, device, jemalloc)
            prometheus = metrics.prometheus_client_version(python, host_env)
            if metrics_dir and prometheus is None:
                raise BundleError(f"--metrics-dir needs prometheus_client in {python}'s environment "
                                  f"(pip install 'edge[metrics]')")
            # The traced boot runs the wheel's code (first on the module path) with this
            # environment's dependencies: what the container will run, at the build host's paths.
            trace = trace_boot(python, [*boot_args, "--package", str(package), *metrics.trace_args(work, prometheus)],
                               work, host_env, use_strace=use_strace, progress=progress)
            progress.done(f"traced boot: READY after {trace.ready_s:.1f} s, {len(trace.module_files)} modules, "
                          f"{len(trace.mapped)} mapped files")
            refused = seccomp.check_traced(trace.syscalls)
            if refused:
                raise BundleError(f"the boot uses syscalls the seccomp profile refuses: {', '.join(refused)} "
                                  f"(add them to image/bundle/seccomp.py ALLOWED if they are safe)")
            layout = Layout(trace.executable, trace.base_prefix, trace.version[:2], site_dirs)
            exclude = [str(package), *(cdi.mount_paths(edits) if edits else [])]
            files = select_files(trace, exclude, layout)
            private = host_private_roots([str(work), *site_dirs, os.path.dirname(os.path.dirname(python))])
            stray = [f for f in files if not layout.relocated(f) and any(f.startswith(r + "/") for r in private)]
            if stray:
                raise BundleError(f"the traced boot read {len(stray)} file(s) from the build host's checkout, "
                                  f"environment or home that are not the runtime's, e.g. {stray[0]}: a bundle "
                                  f"cannot name them")
            wrong = [(f, m) for f in files if (m := elf_machine(f)) is not None and m != arch]
            if wrong:
                raise BundleError(f"{len(wrong)} native file(s) are not {arch}, e.g. {wrong[0][0]} ({wrong[0][1]})")
            rootfs = Rootfs(staging / "rootfs")
            runtime_bytes = rootfs.copy_files(files, layout, progress)
            progress.done(f"copied {len(rootfs.copied)} runtime files, {human_bytes(runtime_bytes)}")
            pairs = layout.replacements()
            rewritten = sum(rewrite_host_paths(str(rootfs.inside(p)), pairs) for p in rootfs.copied)
        env = container_env(layout, threads, device, jemalloc)
        package_bytes = copy_package(rootfs, package, carried, progress)
        progress.done(f"copied model package ({', '.join(carried)}), {human_bytes(package_bytes)}")
        for d in oci_config.MOUNTPOINTS:
            rootfs.mkdir(d)
        # runc gives a tmpfs the mode of the directory it covers, whatever mode= says.
        os.chmod(rootfs.inside("/tmp"), 0o1777)
        progress.spin("compiling byte code")
        rootfs.compile_bytecode(python, [f"{PYTHON_HOME}/lib/python{trace.version[0]}.{trace.version[1]}", SITE])
        limits = resource_limits(package_bytes, runtime_bytes)
        config = oci_config.runtime_config(
            args=[*boot_argv(layout.python), *boot_args, "--package", PACKAGE_PATH,
                  "--bind", tcp or f"ipc://{oci_config.CONTAINER_SOCKET_DIR}/{SOCKET_NAME}"],
            env=env, uid=user[0], gid=user[1], socket_dir_host=socket_dir, arch=arch,
            memory_bytes=limits["memory_bytes"], pids=limits["pids"], nofile=limits["nofile"],
            share_host_network=bool(tcp), state_dir_host=state_dir, code_commit=device_wheel.commit)
        oci_config.add_metrics_dir(config, metrics_dir)  # nothing without --metrics-dir
        deferred = cdi.merge(config, edits) if edits else []
        rootfs.make_mountpoints(config["mounts"])
        rootfs.write_etc(user[0], user[1], config["process"]["user"].get("additionalGids", []))
        has_ldcache = rootfs.ldconfig()
        host_paths = _host_paths(rootfs, config, private)
        if host_paths:
            progress.done(f"warning: {len(host_paths)} file(s) still name a build-host directory, e.g. "
                          f"{host_paths[0]}")
        progress.spin("computing the bundle digest")
        bundle_sha256 = bundle_digest(staging / "rootfs", config)
        config["process"]["env"].append(f"{DIGEST_ENV}={bundle_sha256}")  # replies' lineage names the bundle
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        # Sizes of the copies (a host file may change after it was copied: edits, byte-code rewrites).
        (staging / FILES_NAME).write_text("".join(f"{f}\t{rootfs.inside(f).stat().st_size}\n"
                                                  for f in sorted(rootfs.copied)))
        progress.spin("measuring the source environment")
        env_bytes, env_files = tree_size(*sorted({trace.prefix, trace.base_prefix}))
        bundle_bytes, bundle_files = tree_size(staging / "rootfs")
        container_address = config["process"]["args"][-1]
        meta = {
            "format": BUNDLE_FORMAT,
            "bundle_sha256": bundle_sha256,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "arch": arch,
            "engine": engine,
            "device": device,
            "python": layout.python,
            "python_version": ".".join(map(str, trace.version)),
            "edge": {"commit": device_wheel.commit, "dirty_sha256": device_wheel.dirty_sha256,
                     "wheel": device_wheel.as_dict(), "site": SITE, "python_home": PYTHON_HOME},
            "user": {"uid": user[0], "gid": user[1]},
            "socket_dir": socket_dir,
            "address": tcp or f"ipc://{socket_dir}/{SOCKET_NAME}",
            "container_socket_dir": oci_config.CONTAINER_SOCKET_DIR, "state_dir": state_dir,
            "container_address": container_address,
            "health_probe": ["python3", "-m", "edge.cli", "health", "--connect", container_address],
            "package": {"path": PACKAGE_PATH, "source": package.name, "bytes": package_bytes,
                        "files": carried, "left_out": left_out, **package_identity(package)},
            "sizes": {
                "rootfs_bytes": bundle_bytes, "rootfs_files": bundle_files,
                "runtime_bytes": runtime_bytes, "runtime_files": len(rootfs.copied),
                "package_bytes": package_bytes,
                "source_env_bytes": env_bytes, "source_env_files": env_files,
                "runtime_vs_source_env": round(runtime_bytes / env_bytes, 4) if env_bytes else None,
            },
            "host_paths": {"rewritten": rewritten, "left": host_paths[:20]},
            "trace": _in_container(trace.summary(), layout),
            "seccomp": {"allowed": len(seccomp.ALLOWED), "traced_syscalls": sorted(trace.syscalls)},
            "limits": {**limits, "unit_dropin": UNIT_DROPIN},
            "jemalloc": env.get("LD_PRELOAD"),
            "ld_so_cache": has_ldcache, **metrics.metadata(prometheus, metrics_dir),
            "cdi": None if not edits else {
                "spec": str(cdi_spec), "kind": edits.kind, "devices": edits.devices,
                "device_nodes": len(config["linux"].get("devices", [])), "mounts": len(edits.mounts),
                "deferred_devices": deferred,
            },
            "build_s": round(time.monotonic() - t0, 2),
        }
        (staging / METADATA_NAME).write_text(json.dumps(meta, indent=2) + "\n")
        (staging / UNIT_DROPIN).parent.mkdir()
        (staging / UNIT_DROPIN).write_text(unit_dropin(limits))
        os.chmod(staging, 0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.rename(out, old)
        os.rename(staging, out)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old is not None and old.exists():
            if out.exists():  # the swap was done; only the old bundle's removal was cut short
                shutil.rmtree(old, ignore_errors=True)
            else:  # stopped between the two renames: the old bundle goes back
                os.rename(old, out)
        raise
    progress.done(f"bundle {out}: runtime {human_bytes(runtime_bytes)} in {meta['sizes']['runtime_files']} files "
                  f"(source environment {human_bytes(env_bytes)} in {env_files} files), "
                  f"package {human_bytes(package_bytes)}, {meta['build_s']} s")
    if deferred:
        progress.done(f"{len(deferred)} CDI device node(s) are not on this host; edge-supervise resolves them "
                      f"at start: {', '.join(n['path'] for n in deferred[:4])}{' ...' if len(deferred) > 4 else ''}")
    return meta


def verify_bundle(bundle: Path) -> list[str]:
    """Files of ``rootfs.files`` missing from the rootfs or of another size, and a digest that
    differs from the one the bundle was built with (empty: complete and unchanged)."""
    bundle = Path(bundle)
    problems = []
    for line in (bundle / FILES_NAME).read_text().splitlines():
        path, size = line.rsplit("\t", 1)
        inside = bundle / "rootfs" / path.lstrip("/")
        if not inside.exists():
            problems.append(f"missing: {path}")
        elif inside.stat().st_size != int(size):
            problems.append(f"size differs: {path} ({inside.stat().st_size} != {size})")
    config = json.loads((bundle / "config.json").read_text())
    recorded = config_digest_entry(config)
    if recorded is not None and bundle_digest(bundle / "rootfs", config) != recorded:
        problems.append(f"digest differs: {DIGEST_ENV} in config.json is {recorded[:16]}..., the files hash otherwise")
    return problems


EXIT_CODES = {
    0: "success (verify: every traced file is in the rootfs with its size, and the digest matches)",
    1: "build: the bundle cannot be built as asked on this host (the message says what to change: the "
       "target architecture, a syscall the seccomp profile refuses, a native file of another architecture); "
       "verify: files are missing or changed (each is listed)",
    2: "usage error, or unusable input: --out exists (without --force) or cannot be written, --package is "
       "not a model package, --cdi cannot be read or names no such device, DIR is not a bundle",
    3: "the build failed: the traced boot, building the default package, or writing the bundle",
    130: "interrupted (Ctrl-C): nothing was written, the traced runtime was stopped",
    143: "terminated (SIGTERM): nothing was written, the traced runtime was stopped",
}
_EPILOG = exit_epilog(EXIT_CODES)
_MAKE_BUNDLE = "make one with `edge-bundle build --out DIR`"
_MAKE_PACKAGE = "build one with `edge-package build --out DIR`"


def _check_build_args(args) -> None:
    """The command line's mistakes, found before the minute of tracing and copying."""
    out = Path(os.path.abspath(args.out))
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"--out {out} is a file; give a directory for the bundle")
        if not args.force:
            raise UsageError(f"--out {out} exists; pass --force to replace it, or give another --out")
        if any(out.iterdir()) and not (out / METADATA_NAME).exists():
            raise UsageError(f"--out {out} is not a bundle (no {METADATA_NAME}); --force replaces only a bundle "
                              f"or an empty directory: give another --out")
    problem = writable_dir_problem(out)
    if problem:
        raise UsageError(problem)
    if args.package is not None:
        if not args.package.is_dir():
            raise UsageError(f"--package {args.package}: no such directory; {_MAKE_PACKAGE}")
        if not (args.package / "manifest.json").is_file():
            raise UsageError(f"--package {args.package} is not a model package (no manifest.json); {_MAKE_PACKAGE}")
    if args.cdi is not None and not args.cdi.is_file():
        what = "is a directory" if args.cdi.is_dir() else "no such file"
        raise UsageError(f"--cdi {args.cdi}: {what}; give a CDI spec file (e.g. from `nvidia-ctk cdi generate`)")
    if args.cdi_device and args.cdi is None:
        raise UsageError("--cdi-device needs --cdi SPEC: the spec that defines the device")
    if args.python is not None and not os.path.exists(args.python):
        raise UsageError(f"--python {args.python}: no such file; give the environment's interpreter, "
                          f"e.g. .venv/bin/python")


def _verify(bundle: Path) -> int:
    if not bundle.is_dir():
        what = "no such directory" if not bundle.exists() else "not a directory"
        print(f"edge-bundle verify: {bundle}: {what}; give a bundle directory ({_MAKE_BUNDLE})", file=sys.stderr)
        return 2
    missing = [n for n in (FILES_NAME, "config.json") if not (bundle / n).is_file()]
    if missing:
        print(f"edge-bundle verify: {bundle} is not a bundle (no {' / '.join(missing)}); {_MAKE_BUNDLE}",
              file=sys.stderr)
        return 2
    try:
        problems = verify_bundle(bundle)
    except OSError as exc:
        print(f"edge-bundle verify: {bundle}: cannot read it ({exc})", file=sys.stderr)
        return 2
    except ValueError as exc:  # a rootfs.files or config.json that is not the builder's
        print(f"edge-bundle verify: {bundle}: its {FILES_NAME} or config.json is not as edge-bundle writes them "
              f"({exc}); rebuild it with `edge-bundle build --out {bundle} --force`", file=sys.stderr)
        return 2
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"edge-bundle verify: {len(problems)} problem(s) in {bundle}; rebuild it with "
              f"`edge-bundle build --out {bundle} --force`", file=sys.stderr)
        return 1
    print(f"{bundle}: every traced file is in the rootfs with its size, and the digest matches")
    return 0


def _build(args, progress: Progress) -> int:
    _check_build_args(args)
    check_arch(args.python or sys.executable, args.arch or platform.machine())  # before a default package build
    package = args.package
    if package is None:
        from edge.runtime.default_package import PackageBuildError, default_package_dir, ensure_default_package

        try:
            package = ensure_default_package(default_package_dir())
        except PackageBuildError as exc:
            print(f"edge-bundle build: {exc}", file=sys.stderr)
            return exc.exit_code
    meta = build_bundle(args.out, package=package, engine=args.engine, python=args.python, cdi_spec=args.cdi,
                        cdi_devices=args.cdi_device, socket_dir=args.socket_dir, user=args.user, arch=args.arch,
                        tcp=args.tcp, threads=args.threads, use_strace=args.strace, force=args.force,
                        progress=progress, metrics_dir=args.metrics_dir, state_dir=args.state_dir,
                        allow_dirty=args.allow_dirty, wheel_file=args.wheel)
    print(json.dumps({k: meta[k] for k in ("address", "socket_dir", "arch", "engine", "sizes")}, indent=2))
    return 0


def _failure(exc: Exception) -> tuple[str, int]:
    """The message and exit status (:data:`EXIT_CODES`) of a build or verify that raised ``exc``."""
    if isinstance(exc, UsageError):
        return str(exc), 2
    if isinstance(exc, BundleError):
        return str(exc), 1
    if isinstance(exc, cdi.CdiError):
        return f"{exc}; fix the --cdi spec or the --cdi-device names", 2
    if isinstance(exc, TraceError):
        return str(exc), 3
    from image.bundle.snapshot import SnapshotError

    if isinstance(exc, SnapshotError):
        return str(exc), 3
    return f"failed: {type(exc).__name__}: {exc}", 3  # the type names a bug, should it be one


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="edge-bundle", description="Build or verify an OCI runtime bundle of edge.",
                                 epilog=_EPILOG)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="trace a boot and write DIR/config.json, DIR/rootfs, DIR/edge-bundle.json",
                       epilog=_EPILOG)
    b.add_argument("--out", required=True, type=Path, help="bundle directory to write")
    b.add_argument("--package", type=Path, default=None, help="model package (default: the MiniLM package)")
    b.add_argument("--engine", choices=("onnxruntime", "torchscript"), default="onnxruntime")
    b.add_argument("--cdi", type=Path, default=None, help="CDI spec (JSON or YAML, nvidia-ctk cdi generate)")
    b.add_argument("--cdi-device", action="append", default=None, metavar="NAME", help="CDI device(s) to apply (default: all)")
    b.add_argument("--socket-dir", type=abs_dir, default=DEFAULT_SOCKET_DIR,
                   help="host directory bind-mounted for the ipc socket")
    b.add_argument("--user", type=user_ids, default=DEFAULT_USER, metavar="UID[:GID]", help="runtime's uid:gid (default 61000:61000)")
    b.add_argument("--arch", default=None, help="target architecture, uname -m (default: this host's); must match --python")
    b.add_argument("--python", default=None, help="the environment's interpreter (default: this one)")
    b.add_argument("--tcp", type=tcp_address, default=None, metavar="tcp://HOST:PORT",
                   help="serve TCP on loopback instead of ipc (shares the host network; no CURVE keys in a bundle yet)")
    b.add_argument("--metrics-dir", type=abs_dir, default=None, help="host directory for the metrics textfile edge.prom")
    b.add_argument("--state-dir", type=abs_dir, default=oci_config.STATE_DIR,
                   help="host directory for the runtime's state: its request journal and kept rejected samples, "
                        f"read by `edge trace --state-dir DIR` (default {oci_config.STATE_DIR}; docs/trace.md)")
    b.add_argument("--threads", type=positive_int("threads"), default=None, help="OMP_NUM_THREADS in the container")
    b.add_argument("--strace", choices=("auto", "on", "off"), default="auto", help="also trace syscalls (needs strace)")
    b.add_argument("--allow-dirty", action="store_true",
                   help="build from a tree whose edge/ or pyproject.toml differ from HEAD (the lineage's edge_commit "
                        "then ends in -dirty, with a digest of the difference)")
    b.add_argument("--wheel", type=Path, default=None, metavar="FILE",
                   help="the device wheel to install (one `edge-bundle build` made, e.g. on the host for a build in "
                        "an emulated root); default: built here from the commit")
    b.add_argument("--force", action="store_true", help="replace DIR if it exists")
    b.add_argument("--quiet", action="store_true")
    v = sub.add_parser("verify", help="check that every traced file is in DIR/rootfs", epilog=_EPILOG)
    v.add_argument("bundle", type=Path)
    from image.bundle import snapshot

    snapshot.add_parser(sub, _EPILOG)
    from image import supervisor_zipapp  # edge-supervise, the host's supervisor, as one file

    supervisor_zipapp.add_parser(sub, _EPILOG)
    from image.bundle import oci_image  # the fleet's form: an OCI image layout (docs/fleet.md)

    oci_image.add_parser(sub, _EPILOG)
    from image.bundle import emulated  # another architecture's bundle under qemu-user (docs/fleet.md)

    emulated.add_parser(sub, _EPILOG)
    from image.archive import cli as archive_cli  # the build host's side: keygen, pack, verify-archive

    archive_cli.add_parsers(sub)
    from edge.update.install import cli as install_cli  # the device side: install, status, rollback, mark-good

    install_cli.add_parsers(sub)
    args = ap.parse_args(argv)
    progress = Progress(quiet=getattr(args, "quiet", False))
    prog = f"edge-bundle {args.command}"
    with stop_signals() as stopped:
        try:
            if args.command == "snapshot":
                return snapshot.command(args)
            if args.command == "supervisor":
                return supervisor_zipapp.command(args)
            if args.command == "image":
                return oci_image.command(args)
            if args.command == "emulated":
                return emulated.command(args)
            if args.command in archive_cli.COMMANDS:
                return archive_cli.command(args)
            if args.command in install_cli.COMMANDS:
                return install_cli.command(args)
            return _verify(args.bundle) if args.command == "verify" else _build(args, progress)
        except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - one message, not a traceback
            progress.end_line()
            if isinstance(exc, KeyboardInterrupt) or stopped.signum is not None:
                # (a child we stopped may fail as it goes, e.g. the traced boot "exited before READY")
                done = "" if args.command != "build" else (
                    f"; nothing was written to {args.out} (the staging directory was removed, the traced "
                    f"runtime stopped)")
                print(f"{prog}: {stopped.word}{done}", file=sys.stderr)
                return stopped.exit_code or 130
            message, code = _failure(exc)
            if args.command == "build" and code == 3:
                message += f"\nnothing was written to {args.out}"
            print(f"{prog}: {message}", file=sys.stderr)
            return code


if __name__ == "__main__":
    sys.exit(main())
