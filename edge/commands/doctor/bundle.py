"""The installed bundle and what it needs of the device: itself, its CDI device nodes and bind
mounts, memory, its socket directory.

The bundle's own paths (the device nodes it names, its socket directory, its address) are host
paths; they are read under ``--root``, as every other device path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edge.commands.doctor.context import BundleFacts, Context, as_dict, read_text
from edge.commands.doctor.report import Check, Verdict

__all__ = ["check_bundle", "check_cdi_devices", "check_memory", "check_socket"]

SOCKET_DIR_MODE = 0o750  # the runtime's user and its group (the host's apps) only: edge-supervise sets it
SOCKET_MODE = 0o660  # bind_router's umask (edge/ipc/endpoint.py)
LOW_MEMORY_SHARE = 0.05  # of MemTotal: below it, a running service is about to meet the OOM killer
REINSTALL = "edge-bundle install ARCHIVE (docs/update.md), or edge-bundle build --out DIR on a build host"


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _mib(n: int | float | None) -> str:
    return "?" if n is None else f"{n / (1 << 20):.0f} MiB"


def check_bundle(ctx: Context) -> Check:
    b = ctx.bundle
    if b is None:
        return Check("bundle", Verdict.WARN, f"no bundle at {ctx.bundle_path}: nothing installed to run",
                     f"install one: {REINSTALL}", {"path": str(ctx.bundle_path)})
    if b.error:
        return Check("bundle", Verdict.FAIL, b.error, f"install the bundle again: {REINSTALL}",
                     {"path": str(b.path), "real": str(b.real)})
    meta = b.meta
    package = as_dict(meta.get("package"))
    measured = {"path": str(b.path), "real": str(b.real), "bundle_sha256": meta.get("bundle_sha256"),
                "arch": meta.get("arch"), "engine": meta.get("engine"), "device": meta.get("device"),
                "package": package.get("name"), "package_sha256": package.get("package_sha256"),
                "slot": b.real.parent.name if b.archive is not None else None}
    arch, arch_from = ctx.machine
    if arch and meta.get("arch") and meta["arch"] != arch:
        return Check("bundle", Verdict.FAIL, f"the bundle at {b.path} is built for {meta['arch']}, this machine is "
                                             f"{arch} ({arch_from})", f"install a bundle built for {arch}: {REINSTALL}",
                     measured)
    root_path = (b.config.get("root") or {}).get("path", "rootfs")
    if not os.path.isdir(b.real / root_path):
        return Check("bundle", Verdict.FAIL, f"the bundle at {b.path} has no {root_path}/ (a partial copy)",
                     f"install the bundle again: {REINSTALL}", measured)
    sha = str(meta.get("bundle_sha256") or "?")[:12]
    where = f"slot {measured['slot']}" if measured["slot"] else str(b.real)
    return Check("bundle", Verdict.PASS, f"bundle {sha} ({meta.get('engine')}/{meta.get('device')}, package "
                                         f"{package.get('name')}, {meta.get('arch')}) in {where}", measured=measured)


def _node_problem(ctx: Context, path: str, want: dict | None) -> str | None:
    """Why the host's node at ``path`` cannot serve a container's device entry ``want``."""
    host = ctx.path(path)
    try:
        st = os.stat(host)
    except OSError as exc:
        return f"{path}: {exc.strerror.lower() if exc.strerror else exc}"
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
        return f"{path}: not a device node"
    if want is not None and want.get("major") is not None:
        kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
        have = f"{kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        wanted = f"{want.get('type', kind)} {want.get('major')}:{want.get('minor')}"
        if have != wanted:
            return f"{path}: config.json has {wanted}, the device has {have} (numbers assigned at boot)"
    return None


def check_cdi_devices(ctx: Context) -> Check:
    b = ctx.usable_bundle
    if b is None:
        return Check("cdi_devices", Verdict.NA, "no bundle to read")
    devices = [d for d in (b.config.get("linux") or {}).get("devices") or [] if isinstance(d, dict)]
    cdi = b.meta.get("cdi") if isinstance(b.meta.get("cdi"), dict) else None
    deferred = [d for d in (cdi or {}).get("deferred_devices") or [] if isinstance(d, dict)]
    socket_dir = b.meta.get("socket_dir")
    binds = [m for m in b.config.get("mounts") or [] if isinstance(m, dict) and m.get("type") == "bind"
             and m.get("source") != socket_dir]  # the socket directory is made at start
    problems = [p for d in devices if (p := _node_problem(ctx, d.get("path", ""), d))]
    problems += [p for d in deferred if (p := _node_problem(ctx, d.get("hostPath") or d.get("path", ""), None))]
    for m in binds:
        source = m.get("source", "")
        where = ctx.path(source) if os.path.isabs(source) else b.real / source
        if not os.path.exists(where):
            problems.append(f"bind mount source {source} (for {m.get('destination')}): missing")
    measured = {"devices": [d.get("path") for d in devices], "deferred": [d.get("path") for d in deferred],
                "binds": [m.get("source") for m in binds], "cdi": cdi and {k: cdi.get(k) for k in ("kind", "devices")},
                "problems": problems}
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return Check("cdi_devices", Verdict.FAIL, "; ".join(problems[:3]) + more,
                     "flash or load the GPU driver (the nodes come with L4T), then rebuild the bundle on this device "
                     "from its CDI spec (nvidia-ctk cdi generate; edge-bundle build --cdi-spec)", measured)
    if not devices and not deferred and cdi is None:
        return Check("cdi_devices", Verdict.PASS, "none needed (cpu bundle)", measured=measured)
    return Check("cdi_devices", Verdict.PASS, f"{_n(len(devices), 'device node')}, {len(deferred)} more resolved at "
                                              f"start, {_n(len(binds), 'bind mount')}: all present (CDI "
                                              f"{(cdi or {}).get('kind')})", measured=measured)


def _meminfo(ctx: Context) -> dict[str, int]:
    out = {}
    for line in (read_text(ctx.path("/proc/meminfo"), 1 << 16) or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def check_memory(ctx: Context) -> Check:
    info = _meminfo(ctx)
    available, total = info.get("MemAvailable"), info.get("MemTotal")
    measured = {"mem_available_bytes": available, "mem_total_bytes": total}
    if available is None:
        return Check("memory", Verdict.NA, f"no MemAvailable in {ctx.path('/proc/meminfo')}", measured=measured)
    b = ctx.usable_bundle
    if b is None:
        return Check("memory", Verdict.NA, f"{_mib(available)} available of {_mib(total)}; no bundle to size "
                                           f"against", measured=measured)
    package = as_dict(b.meta.get("package"))
    sizes = as_dict(b.meta.get("sizes"))
    package_bytes = package.get("bytes") or sizes.get("package_bytes") or 0
    limit = ((b.config.get("linux") or {}).get("resources") or {}).get("memory", {}).get("limit")
    # The container may use up to its limit; the package's pages may sit in the page cache
    # outside it (mapped before, by another cgroup): both must fit.
    need = package_bytes + (limit or sizes.get("runtime_bytes") or 0)
    measured.update(package_bytes=package_bytes, memory_limit_bytes=limit, need_bytes=need)
    server = ctx.server
    if server is not None and server.answered:  # its memory is in use already: what is left is headroom
        if total and available < LOW_MEMORY_SHARE * total:
            return Check("memory", Verdict.WARN, f"{_mib(available)} available of {_mib(total)} while the service "
                                                 f"runs: near the OOM killer", "stop what else runs here, or "
                                                                               "lower the bundle's limit", measured)
        return Check("memory", Verdict.PASS, f"{_mib(available)} available of {_mib(total)} while the service runs "
                                             f"(its limit {_mib(limit)})", measured=measured)
    text = (f"{_mib(available)} available of {_mib(total)}; the bundle needs {_mib(need)} (package "
            f"{_mib(package_bytes)} + container limit {_mib(limit)})")
    if available < package_bytes:
        return Check("memory", Verdict.FAIL, f"{text}: not even the package fits", "free memory (stop other "
                                                                                   "services), or install a smaller "
                                                                                   "package", measured)
    if available < need:
        return Check("memory", Verdict.WARN, f"{text}: a start may be OOM-killed under load",
                     "free memory (stop other services), or lower the bundle's limit", measured)
    return Check("memory", Verdict.PASS, text, measured=measured)


def _socket_target(ctx: Context, b: BundleFacts | None) -> tuple[Path, Path] | None:
    """(socket directory, socket file) under the root: the bundle's, else the address's; None: neither
    names one."""
    if b is not None and b.meta.get("socket_dir"):
        d = ctx.path(b.meta["socket_dir"])
        address = str(b.meta.get("address") or "")
        name = os.path.basename(address[len("ipc://"):]) if address.startswith("ipc://") else "edge.sock"
        return d, d / name
    if ctx.address and ctx.address.startswith("ipc://") and not ctx.address.startswith("ipc://@"):
        f = Path(ctx.address[len("ipc://"):])
        return f.parent, f
    return None


def check_socket(ctx: Context) -> Check:
    b = ctx.usable_bundle
    target = _socket_target(ctx, b)
    if target is None:
        why = "a tcp:// address has no socket file" if ctx.address else "no bundle and no address"
        return Check("socket", Verdict.NA, why)
    d, sock = target
    user = as_dict(b.meta.get("user")) if b is not None else {}
    uid, gid = user.get("uid"), user.get("gid")
    measured = {"socket_dir": str(d), "socket": str(sock), "want_uid": uid, "want_mode": oct(SOCKET_DIR_MODE)}
    up = ctx.server is not None and ctx.server.answered
    try:
        st = os.stat(d)
    except OSError:
        if up:
            return Check("socket", Verdict.PASS, f"no {d}, and the server answers elsewhere", measured=measured)
        return Check("socket", Verdict.NA, f"{d} is not made yet: edge-supervise makes it, mode 0750, at start",
                     measured=measured)
    mode = stat.S_IMODE(st.st_mode)
    measured.update(uid=st.st_uid, gid=st.st_gid, mode=oct(mode))
    fix_dir = f"chown {uid}:{gid} {d} && chmod 0750 {d} (edge-supervise does the same at each start)"
    if b is not None and (mode != SOCKET_DIR_MODE or (uid is not None and st.st_uid != uid)):
        return Check("socket", Verdict.FAIL, f"{d} is mode {mode:04o}, owner {st.st_uid}: want 0750, owner {uid} "
                                             f"(the runtime's user; its group, the host's apps, may enter)", fix_dir,
                     measured)
    if b is None and mode & 0o007:
        return Check("socket", Verdict.WARN, f"{d} is mode {mode:04o}: every user may reach the socket",
                     f"chmod o-rwx {d}", measured)
    try:
        sst = os.lstat(sock)
    except OSError:
        state = "the service is down" if not up else "the server answers another way"
        return Check("socket", Verdict.PASS, f"{d} mode {mode:04o} owner {st.st_uid}; no socket file ({state})",
                     measured=measured)
    smode = stat.S_IMODE(sst.st_mode)
    measured.update(socket_mode=oct(smode), socket_uid=sst.st_uid)
    if not stat.S_ISSOCK(sst.st_mode):
        return Check("socket", Verdict.FAIL, f"{sock} is not a socket: the server cannot bind there",
                     f"rm {sock}, then systemctl restart {ctx.unit}", measured)
    if smode & ~SOCKET_MODE:
        return Check("socket", Verdict.FAIL, f"{sock} is mode {smode:04o}: want 0660 (owner and group only)",
                     f"chmod 0660 {sock}; systemctl restart {ctx.unit} makes it afresh", measured)
    left = "" if up else " (left by a stopped server: the next start replaces it)"
    return Check("socket", Verdict.PASS, f"{d} mode {mode:04o} owner {st.st_uid}; {sock.name} mode {smode:04o}{left}",
                 measured=measured)
