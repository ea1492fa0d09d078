"""A bundle for another architecture, built on this host under emulation: ``edge-bundle emulated``.

A bundle's rootfs is traced from a real boot of the target environment (docs/bundle.md), so an
aarch64 (Jetson) bundle needs an aarch64 interpreter running. On an x86_64 build host that is
qemu-user through the kernel's binfmt_misc (Debian: ``qemu-user-static``, which registers its
handlers with the ``F`` flag, so a chroot needs no copy of qemu). This module:

1. makes a Debian root of the target architecture once (``debootstrap``; then a virtual
   environment ``/opt/edge/venv`` with the runtime's packages at the versions this host has,
   their wheels downloaded here for that platform and installed there offline), and
2. runs ``edge-bundle build`` inside it, in a private mount namespace, with this checkout, the
   package and the output directory bound at their own paths: the bundle names the same paths
   an amd64 bundle of this checkout names, and ``edge-bundle image`` takes both.

Everything in the root runs emulated, with qemu's CPU model :data:`QEMU_CPU`: the traced boot
reached READY in 42 s here (about 100x the native boot), within the trace's 300 s deadline; the
whole build took 55 s once the root was made (debootstrap about 2.6 minutes, the venv 40 s).
strace cannot follow an emulated process (qemu-user has no ptrace), so the build runs with
``--strace off``: the rootfs comes from the recorder's files, maps and dlopens alone.

It is a build-host tool: a CUDA build for a Jetson still comes from the Jetson itself (JetPack's
torch and onnxruntime-gpu are not on PyPI); this gives the CPU packages of the same architecture,
which is what an image's arm64 manifest is checked with here (docs/fleet.md).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

__all__ = ["EmulationError", "register_binfmt", "check_binfmt", "make_root", "build_in_root", "add_parser",
           "command", "QEMU_CPU", "EMULATED_MASKS"]

REPO = Path(__file__).resolve().parents[2]
VENV = "/opt/edge/venv"
WHEELS = "/opt/edge/wheels"
# uname -m -> Debian's architecture, qemu's handler name, pip's platform tags
ARCHES = {
    "aarch64": {"deb": "arm64", "qemu": "qemu-aarch64",
                "pip": ["manylinux2014_aarch64", "manylinux_2_28_aarch64", "manylinux_2_17_aarch64"]},
}
# qemu's CPU model for the emulated processes (QEMU_CPU). Its default ("max") has SVE, which qemu 7.2
# emulates so slowly that ONNX Runtime's 1x64 run takes 95 s; a Neoverse N1 (Armv8.2, NEON, no SVE:
# the class of a Jetson Orin's Cortex-A78AE) takes 4.7 s, so the trace's warm-up fits its deadline.
QEMU_CPU = "neoverse-n1"
# What an emulated container must not see: the host's /sys/devices/system/cpu describes x86 cores,
# and the cpuinfo library in onnxruntime's aarch64 wheel crashes the emulated process on it
# (SIGSEGV at import). Masked (podman --security-opt mask=..., OCI linux.maskedPaths), cpuinfo
# gives up with a warning and ORT runs. A device has its own /sys: this is for emulation only.
EMULATED_MASKS = ["/sys/devices/system/cpu"]
# What the runtime imports (pyproject's dependencies) and each engine's package.
DEVICE_DISTS = ["numpy", "pyzmq", "flatbuffers", "msgpack"]
ENGINE_DISTS = {"onnxruntime": ["onnxruntime"], "torchscript": ["torch"]}
DEBIAN_PACKAGES = ["python3", "python3-venv", "ca-certificates", "libgomp1"]


class EmulationError(Exception):
    """What is missing on this host for an emulated build; the message says how to get it."""


BINFMT = Path("/proc/sys/fs/binfmt_misc")
BINFMT_CONF = Path("/usr/lib/binfmt.d")  # qemu-user-static's handlers, in systemd-binfmt's format


def register_binfmt(arch: str) -> Path:
    """Register qemu-user-static's handler for ``arch`` with the kernel, as systemd-binfmt does at
    boot; for a host (a container, a chroot) where nothing did: mounts binfmt_misc when it is not,
    then writes the handler's line (with its F flag) into ``register``."""
    qemu = ARCHES[arch]["qemu"]
    conf = BINFMT_CONF / f"{qemu}.conf"
    if not conf.is_file():
        raise EmulationError(f"{conf} is missing: this host cannot run {arch} programs. "
                             f"Install qemu-user-static (apt-get install qemu-user-static)")
    if not (BINFMT / "register").exists():
        r = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True)
        if r.returncode != 0:
            raise EmulationError(f"cannot mount binfmt_misc on {BINFMT}: {r.stderr.strip()} (as root: "
                                 f"mount -t binfmt_misc binfmt_misc {BINFMT})")
    line = next((x for x in conf.read_text().splitlines() if x.startswith(":")), None)
    if line is None:
        raise EmulationError(f"{conf} has no handler line (':name:type:...'): reinstall qemu-user-static")
    try:
        (BINFMT / "register").write_text(line)
    except OSError as exc:
        if not (BINFMT / qemu).exists():  # EEXIST: registered meanwhile
            raise EmulationError(f"cannot register {conf} with {BINFMT / 'register'}: {exc.strerror} "
                                 f"(as root: cat {conf} > {BINFMT / 'register'})") from None
    return BINFMT / qemu


def check_binfmt(arch: str, register: bool = True, say=lambda m: None) -> str:
    """The binfmt_misc handler that runs ``arch`` binaries here, registered first when it is missing
    and ``register``; raises when there is none usable."""
    if arch not in ARCHES:
        raise EmulationError(f"no emulated build for {arch!r} (known: {', '.join(ARCHES)})")
    handler = BINFMT / ARCHES[arch]["qemu"]
    if not handler.exists() and register:
        say(f"registering {ARCHES[arch]['qemu']} with binfmt_misc ({BINFMT_CONF})")
        register_binfmt(arch)
    try:
        text = handler.read_text()
    except OSError:
        raise EmulationError(f"{handler} is missing: this host cannot run {arch} programs. "
                             f"Install qemu-user-static (apt-get install qemu-user-static), whose handlers "
                             f"edge-bundle emulated registers") from None
    flags = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("flags:")), "")
    if not text.startswith("enabled") or "F" not in flags:
        raise EmulationError(f"{handler} is not enabled with the F (fix binary) flag (flags: {flags!r}); "
                             f"a chroot cannot reach the emulator without it: update-binfmts --enable "
                             f"{ARCHES[arch]['qemu']}")
    return str(handler)


def _run(cmd: list[str], what: str, say) -> None:
    """``cmd``, its output kept and shown (the end of it) only when it fails."""
    say(what)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if r.returncode != 0:
        raise EmulationError(f"{what}: failed (exit {r.returncode}):\n{r.stdout[-2000:]}")


def _pins(engine: str) -> list[str]:
    """``name==version`` for the runtime's packages, as installed here: the target runs the same versions."""
    pins = []
    for dist in DEVICE_DISTS + ENGINE_DISTS[engine]:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            raise EmulationError(f"{dist} is not installed here, so its version is unknown: "
                                 f"pip install -e '.[{engine}]'") from None
        pins.append(f"{dist}=={version.split('+')[0]}")  # torch 2.13.0+cpu here: PyPI's aarch64 wheel is 2.13.0
    return pins


def _chroot(root: Path, argv: list[str], binds: list[Path] = (), env: dict | None = None, cwd: str = "/") -> list[str]:
    """``argv`` run in ``root`` in a mount namespace of its own: /proc, /dev and ``binds`` (at their own
    paths) are mounted there and vanish with it."""
    lines = ["set -e"]
    # No /sys: the host's CPU topology crashes the emulated ORT (EMULATED_MASKS).
    for src, dst in (("/proc", "proc"), ("/dev", "dev")):
        lines.append(f"mount --rbind {src} {shlex.quote(str(root / dst))}")
    for b in binds:
        target = root / str(b).lstrip("/")
        lines.append(f"mkdir -p {shlex.quote(str(target))} && mount --rbind {shlex.quote(str(b))} "
                     f"{shlex.quote(str(target))}")
    env_args = [f"{k}={v}" for k, v in {**_root_env(), **(env or {})}.items()]
    inner = ["chroot", str(root), "/usr/bin/env", "-i", *env_args, "/bin/sh", "-c",
             f"cd {shlex.quote(cwd)} && exec " + " ".join(shlex.quote(a) for a in argv)]
    lines.append("exec " + " ".join(shlex.quote(a) for a in inner))
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", "\n".join(lines)]


def _root_env() -> dict:
    return {"PATH": f"{VENV}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


def make_root(root: Path, arch: str, engine: str = "onnxruntime", suite: str = "bookworm",
              mirror: str | None = None, say=lambda m: None) -> dict:
    """A Debian ``suite`` root of ``arch`` at ``root`` with ``/opt/edge/venv`` holding the runtime's packages
    for ``engine``; kept between builds (``root``/opt/edge/root.json says what it holds). One maker at a
    time (a lock beside ``root``); debootstrap writes ``ROOT.partial``, renamed when it is done, so an
    interrupted one is started again rather than taken for a root."""
    check_binfmt(arch, say=say)
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(f".{root.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make_root(root, arch, engine, suite, mirror, say)


def _make_root(root: Path, arch: str, engine: str, suite: str, mirror: str | None, say) -> dict:
    spec = ARCHES[arch]
    record = root / "opt" / "edge" / "root.json"
    pins = _pins(engine)
    if record.exists():
        have = json.loads(record.read_text())
        if have.get("arch") == arch and set(pins) <= set(have.get("pins", [])) and "site" in have:
            say(f"{root}: {arch} root with {', '.join(pins)} already made")
            return have
    if not root.exists():
        if shutil.which("debootstrap") is None:
            raise EmulationError("debootstrap is not installed (apt-get install debootstrap)")
        partial = root.with_name(f"{root.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        cmd = ["debootstrap", f"--arch={spec['deb']}", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
               suite, str(partial), *([mirror] if mirror else [])]
        _run(cmd, f"debootstrap {suite} {spec['deb']} into {partial} (emulated; about 3 minutes)", say)
        partial.rename(root)
    py = subprocess.run(_chroot(root, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]),
                        capture_output=True, text=True)
    if py.returncode != 0:
        raise EmulationError(f"the root's python3 does not run: {py.stderr.strip()[-300:]}")
    version = py.stdout.strip()
    if not (root / VENV.lstrip("/") / "bin" / "python").exists():
        _run(_chroot(root, ["python3", "-m", "venv", VENV]), "venv", say)
    wheels = root / WHEELS.lstrip("/")
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in spec["pip"] for a in ("--platform", p)]
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *platforms,
          "--python-version", version, "--implementation", "cp", "-d", str(wheels), *pins],
         f"wheels for {arch}, python {version}", say)
    _run(_chroot(root, ["pip", "install", "--quiet", "--no-index", "--find-links", WHEELS, *pins], env=_root_env()),
         "install into the root's venv (emulated)", say)
    site = subprocess.run(_chroot(root, ["python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  env=_root_env()), capture_output=True, text=True, check=True).stdout.strip()
    have = {"arch": arch, "suite": suite, "python": version, "venv": VENV, "pins": sorted(pins), "site": site}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(have, indent=2) + "\n")
    return have


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def build_in_root(root: Path, arch: str, build_args: list[str], say=lambda m: None, qemu_cpu: str = QEMU_CPU) -> int:
    """``edge-bundle build BUILD_ARGS --arch ARCH --strace off`` inside ``root`` with qemu's CPU model
    ``qemu_cpu``; its exit status."""
    check_binfmt(arch, say=say)
    out, package = _option(build_args, "--out"), _option(build_args, "--package")
    if out is None:
        raise EmulationError("the build's arguments need --out DIR")
    if not (root / VENV.lstrip("/") / "bin" / "python").exists():
        raise EmulationError(f"{root} has no {VENV}: make it first (edge-bundle emulated --arch {arch} --root {root})")
    if package is not None and not Path(package).is_dir():
        raise EmulationError(f"--package {package} is not a directory (a model package: edge-package build --out DIR)")
    out_parent = Path(out).resolve().parent
    out_parent.mkdir(parents=True, exist_ok=True)
    binds = [REPO, out_parent] + ([Path(package).resolve()] if package else [])
    args = [os.path.abspath(a) if i > 0 and build_args[i - 1] in ("--out", "--package") else a
            for i, a in enumerate(build_args)]
    env = {**_root_env(), "PYTHONDONTWRITEBYTECODE": "1", "QEMU_CPU": qemu_cpu}  # the trace passes it on
    record = json.loads((root / "opt" / "edge" / "root.json").read_text())
    # The device wheel is built here, from this checkout's commit (the root has no git), and
    # handed in: the bundle runs that commit's code whatever the root imports its builder from.
    from image.bundle.wheel import DirtyTree, build_device_wheel

    with tempfile.TemporaryDirectory(prefix=".edge-wheel-", dir=out_parent) as wheel_dir:
        try:
            wheel = build_device_wheel(REPO, Path(wheel_dir), allow_dirty="--allow-dirty" in build_args)
        except DirtyTree as exc:
            raise EmulationError(str(exc)) from None
        argv = [f"{VENV}/bin/python", "-m", "image.build_bundle", "build", *args, "--arch", arch, "--strace", "off",
                "--wheel", str(wheel.path)]
        # One build at a time in a root: the .pth names the checkout this build binds at its own path,
        # from which the root's interpreter imports the builder (the root may serve several checkouts).
        with open(root / "opt" / "edge" / ".build.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            (root / record["site"].lstrip("/") / "edge-checkout.pth").write_text(f"{REPO}\n")
            say(f"edge-bundle build in the {arch} root (emulated, QEMU_CPU={qemu_cpu}): {' '.join(args)}")
            return subprocess.run(_chroot(root, argv, binds=sorted(set(binds)), env=env, cwd=str(REPO))).returncode


def add_parser(sub, epilog: str) -> None:
    p = sub.add_parser("emulated", epilog=epilog,
                       help="build a bundle for another architecture (aarch64) on this host, under qemu-user "
                            "emulation in a Debian root of that architecture (docs/fleet.md)")
    p.add_argument("--arch", default="aarch64", choices=sorted(ARCHES), help="the target's uname -m")
    p.add_argument("--root", required=True, type=Path, metavar="DIR",
                   help="the target's Debian root, made here once (debootstrap + /opt/edge/venv) and reused")
    p.add_argument("--engine", default="onnxruntime", choices=sorted(ENGINE_DISTS),
                   help="whose packages the root's venv gets (the build's --engine)")
    p.add_argument("--suite", default="bookworm", help="the Debian release of the root")
    p.add_argument("--mirror", default=None, metavar="URL", help="debootstrap's mirror (default: its own)")
    p.add_argument("--qemu-cpu", default=QEMU_CPU, metavar="MODEL",
                   help=f"qemu-user's CPU model for the build's processes (QEMU_CPU; default {QEMU_CPU}: "
                        f"no SVE, which qemu emulates slowly)")
    p.add_argument("--root-only", action="store_true", help="make the root, build nothing")
    p.add_argument("build_args", nargs="*", metavar="-- BUILD_ARGS",
                   help="edge-bundle build's arguments (--out DIR --package DIR ...) after --")


def command(args) -> int:
    def say(msg: str) -> None:
        print(f"edge-bundle emulated: {msg}", file=sys.stderr, flush=True)

    try:
        make_root(args.root.resolve(), args.arch, args.engine, args.suite, args.mirror, say)
        if args.root_only:
            return 0
        build_args = list(args.build_args)
        if "--engine" not in build_args:
            build_args += ["--engine", args.engine]
        return build_in_root(args.root.resolve(), args.arch, build_args, say, args.qemu_cpu)
    except EmulationError as exc:
        print(f"edge-bundle emulated: {exc}", file=sys.stderr)
        return 2
