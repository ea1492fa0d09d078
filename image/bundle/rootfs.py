"""Lay out the container's root: the traced files, the model package, /etc.

The runtime's own files (the interpreter, its standard library, the device wheel's install and
the environment's site-packages) go to the fixed paths of image/bundle/layout.py, whatever the
build host's paths were; everything else the boot touched (system libraries, the dynamic
loader) keeps its host path, which is a distribution's path on any build host. Symlinks on the
way to a kept file (``/lib -> usr/lib``, ``libfoo.so.1 -> libfoo.so.1.2``) are recreated as
symlinks; directories are created real and 0755, never traversed through a link, so an
absolute link can never point a copy at the build host's own tree.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from edge.system.elf import ELF_MACHINES, elf_machine  # re-exported: the builder checks its interpreter with it
from image.bundle.layout import Layout, python_links
from image.bundle.trace import Trace

__all__ = ["Rootfs", "select_files", "elf_machine", "ELF_MACHINES", "tree_size", "PACKAGE_PATH"]

PACKAGE_PATH = "/opt/edge/package"  # where the model package lives inside the container
# Never copied: kernel and runtime filesystems, and files that describe the build host.
# The telemetry sampler (edge/observability/telemetry/) reads the build host's L4T release and power mode
# after READY, inside the trace: a copy would freeze the build host's into the bundle.
ALWAYS_EXCLUDED = ("/proc/", "/sys/", "/dev/", "/run/", "/tmp/", "/var/run/", "/var/tmp/", "/var/lib/nvpmodel/")
HOST_IDENTITY = {"/etc/hostname", "/etc/machine-id", "/etc/resolv.conf", "/.dockerenv", "/etc/ld.so.cache",
                 "/etc/passwd", "/etc/group", "/etc/mtab", "/etc/nv_tegra_release", "/etc/nvpmodel.conf"}


def elf_interpreter(path: str) -> str | None:
    """The PT_INTERP of an ELF executable (the dynamic loader the kernel starts), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF":
                return None
            is64, order = head[4] == 2, "little" if head[5] == 1 else "big"
            u = lambda b: int.from_bytes(b, order)  # noqa: E731
            phoff, phentsize, phnum = (u(head[32:40]), u(head[54:56]), u(head[56:58])) if is64 else \
                (u(head[28:32]), u(head[42:44]), u(head[44:46]))
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                ph = f.read(phentsize)
                if u(ph[0:4]) == 3:  # PT_INTERP
                    off, size = (u(ph[8:16]), u(ph[32:40])) if is64 else (u(ph[4:8]), u(ph[16:20]))
                    f.seek(off)
                    return f.read(size).rstrip(b"\0").decode()
    except OSError:
        return None
    return None


def _sibling_links(files: set[str]) -> set[str]:
    """Symlinks beside each library that resolve to it (``libstdc++.so.6 -> libstdc++.so.6.0.30``).

    /proc/self/maps names the file a link resolved to, while the loader opens the soname;
    without the link the library would be there and still not be found.
    """
    by_dir: dict[str, set[str]] = {}
    for f in files:
        if ".so" in os.path.basename(f):
            by_dir.setdefault(os.path.dirname(f), set()).add(os.path.realpath(f))
    links = set()
    for d, targets in by_dir.items():
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.is_symlink() and os.path.realpath(e.path) in targets:
                links.add(e.path)
    return links


def _under(path: str, prefixes) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in prefixes)


def _startup_files(trace: Trace) -> set[str]:
    """What the interpreter reads before any hook can run: its real file and its prefix's landmark.

    No ``.pth`` files: the runtime starts with ``-S`` (edge/runtime/launch.py), and one copied
    without the module it imports (an editable install's finder) would break every
    other interpreter started in the container, ``runc exec python`` included. No
    ``pyvenv.cfg``: the container names its prefix with ``PYTHONHOME``.
    """
    major, minor = trace.version[:2]
    stdlib = os.path.join(trace.base_prefix, "lib", f"python{major}.{minor}")
    return {os.path.realpath(trace.executable), os.path.join(stdlib, "os.py")}


# Files the runtime may read after READY, when the trace may or may not have seen it happen (the
# telemetry sampler's first look at the OS; the system's TLS configuration and CA store, which
# ssl's default context opens when a lazily imported library makes one, e.g. with prometheus_client
# in some environments): always copied when the host has them, so two builds do not differ by a race.
LATE_READS = ("/etc/os-release", "/etc/ssl/openssl.cnf", "/etc/ssl/certs/ca-certificates.crt")


def _tls_late_reads() -> set[str]:
    """The paths OpenSSL itself opens for :data:`LATE_READS`: its configuration and CA file under
    its own directory (Debian's ``/usr/lib/ssl/openssl.cnf``, a link into ``/etc/ssl``). Copying
    only the link's target left the link to the race: one build had it, the next did not."""
    import ssl

    cafile = ssl.get_default_verify_paths().openssl_cafile
    return {os.path.join(os.path.dirname(cafile), "openssl.cnf"), cafile} if cafile else set()


# Packages copied whole: their modules are imported lazily, after READY (prometheus_client: by the
# metrics publisher, image/bundle/metrics.py), so the trace may not see them all.
WHOLE_PACKAGES = ("edge", "prometheus_client")


def _package_files(trace: Trace, name: str = "edge") -> set[str]:
    """The whole ``edge`` package (sources and data): modules imported lazily after the trace are there too.
    The same for another package ``name`` the traced boot imported (none when it did not)."""
    init = next((f for f in trace.module_files.get(name, []) if f.endswith("__init__.py")), None)
    if init is None:
        return set()
    return {str(p) for p in Path(init).parent.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")}


def _programs(trace: Trace) -> set[str]:
    found = set()
    for prog in trace.executed:
        path = prog if os.path.isabs(prog) else shutil.which(prog)
        if path:
            found.add(path)
    return found


def select_files(trace: Trace, exclude: list[str], layout: Layout) -> list[str]:
    """Regular files (or links to them) to copy: the trace, the startup files, :data:`WHOLE_PACKAGES`.

    The runtime's own files (``layout`` moves them to fixed paths) are kept wherever they lie,
    /tmp included; the others are left out under :data:`ALWAYS_EXCLUDED`. Never byte code (the
    host's records its own paths and times; the rootfs's is compiled in place,
    :meth:`Rootfs.compile_bytecode`) nor a ``pyvenv.cfg`` (the container names its prefix).
    """
    wanted = trace.all_paths() | _startup_files(trace) | _programs(trace) | set(LATE_READS) | _tls_late_reads()
    wanted |= {f for name in WHOLE_PACKAGES for f in _package_files(trace, name)}
    wanted |= {i for f in list(wanted) if (i := elf_interpreter(f))}
    wanted |= _sibling_links(wanted)
    keep = []
    for path in wanted:
        path = os.path.normpath(path)
        if path.endswith((".pyc", ".pyo")) or "/__pycache__/" in path or os.path.basename(path) == "pyvenv.cfg":
            continue
        if _under(path, exclude):
            continue
        if not layout.relocated(path) and (_under(path + "/", ALWAYS_EXCLUDED) or path in HOST_IDENTITY):
            continue
        if os.path.isfile(path):  # follows links: the link is recreated, the file copied
            keep.append(path)
    return sorted(set(keep) | _package_inits(keep, layout))


def _package_inits(files: list[str], layout: Layout) -> set[str]:
    """The ``__init__.py`` of every package directory above the runtime's files. Whether the trace
    sees one depends on how a module was found (``find_spec`` of ``onnxruntime`` stats it, and
    only a tracer of syscalls sees a stat), so it is added always: without it a package is a
    namespace package in the container, and the rootfs would differ between build hosts."""
    inits = set()
    for f in files:
        if not layout.relocated(f):
            continue
        d = os.path.dirname(f)
        while (init := os.path.join(d, "__init__.py")) and os.path.isfile(init):
            inits.add(init)
            d = os.path.dirname(d)
    return inits


def tree_size(*roots: str | os.PathLike) -> tuple[int, int]:
    """(bytes, files) of the regular files under ``roots``, each inode counted once, links not followed."""
    seen: set[tuple[int, int]] = set()
    total = count = 0
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                try:
                    st = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
                    count += 1
    return total, count


class Rootfs:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self.copied: list[str] = []  # rootfs paths (container view) of the regular files copied

    def inside(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def mkdir(self, path: str) -> None:
        """Create ``path`` (absolute, container view) as real 0755 directories."""
        cur = self.root
        for part in Path(path).parts[1:]:
            cur = cur / part
            if cur.is_symlink():
                raise RuntimeError(f"{cur} is a symlink; refusing to create directories through it")
            if not cur.exists():
                cur.mkdir()
                os.chmod(cur, 0o755)

    def materialize(self, path: str, _depth: int = 0) -> None:
        """Copy host ``path`` to the same path inside, recreating every symlink on the way."""
        if _depth > 40:
            raise RuntimeError(f"too many levels of symbolic links resolving {path}")
        parts = Path(path).parts[1:]
        cur = "/"
        for i, part in enumerate(parts):
            nxt = os.path.join(cur, part)
            if os.path.islink(nxt):
                target = os.readlink(nxt)
                dest = self.inside(nxt)
                if not os.path.lexists(dest):
                    self.mkdir(cur)
                    os.symlink(target, dest)
                resolved = os.path.normpath(target if os.path.isabs(target) else os.path.join(cur, target))
                self.materialize(os.path.join(resolved, *parts[i + 1:]), _depth + 1)
                return
            cur = nxt
        dest = self.inside(cur)
        if os.path.isdir(cur):
            self.mkdir(cur)
            return
        if dest.exists():
            return
        self.mkdir(os.path.dirname(cur))
        self._copy(cur, dest, cur)

    def place(self, host: str, path: str) -> None:
        """Copy host file ``host`` (its links followed) to rootfs path ``path``."""
        dest = self.inside(path)
        if dest.exists():
            return
        self.mkdir(os.path.dirname(path))
        self._copy(os.path.realpath(host), dest, path)

    def _copy(self, src: str, dest: Path, path: str) -> None:
        shutil.copyfile(src, dest)  # content and mode only: no host time or owner comes along
        mode = os.stat(src).st_mode
        os.chmod(dest, stat.S_IMODE(mode) & 0o755 | 0o444 | (0o111 if mode & 0o111 else 0))
        self.copied.append(path)

    def link(self, path: str, target: str) -> None:
        """A symlink at rootfs path ``path`` to ``target`` (as written)."""
        dest = self.inside(path)
        if os.path.lexists(dest):
            return
        self.mkdir(os.path.dirname(path))
        os.symlink(target, dest)

    def make_mountpoints(self, mounts: list[dict]) -> None:
        """A directory, or an empty file for a bind mount of a file, at every mount destination.

        runc would create them itself, but in the bundle (which may be read-only on the device).
        """
        for m in mounts:
            dest = m["destination"]
            if m.get("type") == "bind" and os.path.lexists(m["source"]):
                is_dir = os.path.isdir(m["source"])
            else:  # a library file mounted from a host we cannot see: judge by its name
                is_dir = m.get("type") != "bind" or ".so" not in os.path.basename(dest)
            self.mkdir(dest if is_dir else os.path.dirname(dest))
            if not is_dir and not self.inside(dest).exists():
                self.inside(dest).touch()

    def copy_files(self, paths: list[str], layout: Layout, progress=None, step: str = "copying runtime files") -> int:
        """Copy the host files ``paths``: the runtime's to their fixed paths (``layout``), the rest
        to their host paths; then the links to the interpreter. Returns the bytes copied."""
        nbytes = 0
        for i, path in enumerate(paths, 1):
            before = len(self.copied)
            if layout.relocated(path):
                self.place(path, layout.container_path(path))
            else:
                self.materialize(path)  # a second name of a file already copied adds nothing
            nbytes += sum(self.inside(p).stat().st_size for p in self.copied[before:])
            if progress:
                progress.count(step, i, len(paths), nbytes)
        for link, target in python_links(layout.python).items():
            self.link(link, target)
        return nbytes

    def write_etc(self, uid: int, gid: int, extra_gids: list[int]) -> None:
        """Minimal passwd/group: the runtime's user resolves to a name, nothing else exists."""
        self.mkdir("/etc")
        (self.inside("/etc/passwd")).write_text(
            f"root:x:0:0:root:/:/usr/sbin/nologin\nedge:x:{uid}:{gid}:edge runtime:/tmp:/usr/sbin/nologin\n")
        groups = ["root:x:0:", f"edge:x:{gid}:"] + [f"gpu{g}:x:{g}:edge" for g in extra_gids if g not in (0, gid)]
        (self.inside("/etc/group")).write_text("\n".join(groups) + "\n")

    def compile_bytecode(self, python: str, prefixes: list[str]) -> None:
        """Write the .pyc of every copied source, as the target interpreter would.

        The root is read-only and PYTHONDONTWRITEBYTECODE is set, so a missing .pyc would be
        compiled again on every boot. ``-s/-p`` make the recorded source path the container
        path, not the build directory; ``unchecked-hash`` records no source time (the rootfs
        keeps no host times) and has the interpreter trust the read-only root's byte code.
        """
        dirs = [str(self.inside(p)) for p in prefixes if self.inside(p).is_dir()]
        if not dirs:
            return
        cmd = [python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
               "-s", str(self.root), "-p", "/", *dirs]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compileall failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")

    def ldconfig(self) -> bool:
        """A loader cache of this root's libraries, when the build host has ldconfig."""
        exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
        if exe is None:
            return False
        self.mkdir("/etc")
        # -X: only the cache, no soname links: the tree keeps exactly the traced files.
        return subprocess.run([exe, "-X", "-r", str(self.root)], capture_output=True).returncode == 0
