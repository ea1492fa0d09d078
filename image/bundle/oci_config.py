"""``config.json`` of the bundle, for the OCI runtime spec runc 1.1 implements (1.0.2-dev).

What the runtime gets, and why:

* a read-only root; writable only ``/tmp`` (tmpfs: HOME, so ONNX Runtime's SQLite database
  under ``$HOME/.cache`` lands there) and the socket directory, bind-mounted from the host
  so host applications reach the ``ipc://`` socket; with ``--metrics-dir``, the metrics
  directory too (:func:`add_metrics_dir`), where node_exporter reads the textfile;
* a non-root uid/gid, ``noNewPrivileges``, every capability dropped, a seccomp allowlist;
* its own pid/ipc/uts/mount namespaces, and its own (empty) network namespace unless the
  runtime is configured for TCP, which needs the host's;
* limits, so a leak or a flood ends in this container's cgroup, not in the device's OOM
  killer: memory (no swap) from the package's size (:func:`memory_limit`), tasks
  (:data:`PIDS_LIMIT`), open files (:data:`NOFILE`).
"""

from __future__ import annotations

from image.bundle import seccomp

__all__ = ["OCI_VERSION", "CONTAINER_SOCKET_DIR", "CONTAINER_METRICS_DIR", "NOTIFY_DIR", "MOUNTPOINTS", "NOFILE",
           "PIDS_LIMIT", "MEMORY_HEADROOM", "STATE_DIR", "memory_limit", "runtime_config", "add_metrics_dir",
           "add_state_dir", "host_dirs"]

OCI_VERSION = "1.0.2-dev"  # `runc spec` of runc 1.1.x writes this version
CONTAINER_SOCKET_DIR = "/run/edge"
STATE_DIR = "/var/lib/edge/runtime"  # host and container: the runtime's state (journal, rejected samples)
CONTAINER_METRICS_DIR = "/run/edge-metrics"  # --metrics-dir's bind: the runtime writes edge.prom there
NOTIFY_DIR = "/run/notify"  # where runc bind-mounts its NOTIFY_SOCKET relay (runc 1.1)
TMP_SIZE = "64m"  # /tmp tmpfs: ORT's database, nothing big (bytes, tmpfs size= syntax)
SHM_SIZE = "65536k"  # /dev/shm tmpfs (runc spec's default)
# Directories runc mounts onto; created in the rootfs at build time so runc never has to
# write into the bundle (it may live on a read-only partition).
MOUNTPOINTS = ["/proc", "/dev", "/sys", "/tmp", CONTAINER_SOCKET_DIR, CONTAINER_METRICS_DIR, NOTIFY_DIR]
MIB = 1 << 20
# Open files, soft = hard: one per client connection. 20,000 held connections must fit; the
# server caps its connections below the soft limit (edge/ipc/connections.py) and raises the
# soft limit to the hard one itself (edge/boot.py), so soft = hard costs nothing.
NOFILE = 65536
# Tasks (threads and processes) of the container. The runtime has a few dozen threads at most:
# ORT's intra- and inter-op pools or torch's (one per core each, 12 cores on an AGX Orin),
# libzmq's I/O and reaper threads, the server's I/O, engine and tokenizer threads, jemalloc's
# background threads (one per core). 256 is 4x that, and stops a thread leak or a fork bomb.
PIDS_LIMIT = 256
# Memory above the files the container maps (bytes). The runtime's own bound is "mapped weights
# plus 512 MiB" of anonymous memory. On top of it the cgroup is charged for the tmpfs mounts
# (/tmp 64 MiB, /dev/shm 64 MiB) and for each client connection: 26 KiB, held idle or after one
# request (measured in this bundle under runc, 4,000 connections: +100 MiB of memory.usage, libzmq's
# buffers and pipes plus the kernel's socket), so 500 MiB for the 20,000 connections NOFILE is
# sized for. 512 + 128 + 500 = 1140 MiB; 1.5 GiB leaves 400 MiB of margin.
MEMORY_HEADROOM = 1536 * MIB  # 1.5 GiB


def memory_limit(mapped_bytes: int) -> int:
    """``memory.max`` of the container (bytes): the files it maps, plus :data:`MEMORY_HEADROOM`,
    rounded up to a MiB.

    ``mapped_bytes`` is the model package's size on disk plus the runtime's files (libraries,
    byte code): mapped and read pages are page cache charged to the container's cgroup, so a
    limit below them would make the kernel evict the weights the engine is reading (a slow
    thrash, not an OOM kill). The whole package counts, though one engine reads only its files:
    the limit is a bound, not an estimate.
    """
    if mapped_bytes < 0:
        raise ValueError(f"mapped_bytes must be >= 0, got {mapped_bytes}")
    return -(-(mapped_bytes + MEMORY_HEADROOM) // MIB) * MIB


# runc's default masked paths, and the TPM's: what the container reads there is nobody's business
# (power readings have leaked secrets through RAPL timing; the TPM's event log names the boot
# chain). runc skips a path the host does not have.
_MASKED = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
           "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi", "/sys/devices/virtual/powercap",
           "/sys/class/tpm", "/sys/class/tpmrm", "/sys/kernel/security"]
_READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def _mounts(socket_dir_host: str) -> list[dict]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={SHM_SIZE}"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
         "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "noexec", "mode=1777", f"size={TMP_SIZE}"]},
        {"destination": CONTAINER_SOCKET_DIR, "type": "bind", "source": socket_dir_host,
         "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]},
    ]


def add_metrics_dir(config: dict, metrics_dir_host: str | None) -> None:
    """Bind ``metrics_dir_host`` on :data:`CONTAINER_METRICS_DIR` (read-write, as the socket directory)
    and have the runtime write its textfile there (``EDGE_METRICS_TEXTFILE``, edge/runtime/serve_args.py).
    Nothing when ``metrics_dir_host`` is None (no ``--metrics-dir``)."""
    if metrics_dir_host is None:
        return
    config["mounts"].append({"destination": CONTAINER_METRICS_DIR, "type": "bind", "source": metrics_dir_host,
                             "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]})
    config["process"]["env"].append(f"EDGE_METRICS_TEXTFILE={CONTAINER_METRICS_DIR}")


def add_state_dir(config: dict, state_dir_host: str = STATE_DIR, code_commit: str | None = None) -> None:
    """Bind ``state_dir_host`` on :data:`STATE_DIR` (read-write: the root is read-only) as the
    runtime's state directory (``EDGE_STATE_DIR``: its request journal and kept rejected samples,
    docs/trace.md). By default the host directory is that same path, so ``edge trace`` on the host
    finds what the container wrote without ``--state-dir``.
    ``EDGE_CODE_COMMIT``: the commit the device wheel was built from (image/bundle/wheel.py), for
    the replies' lineage; the wheel's edge/_build_info.json says the same."""
    config["mounts"].append({"destination": STATE_DIR, "type": "bind", "source": state_dir_host,
                             "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]})
    config["process"]["env"].append(f"EDGE_STATE_DIR={STATE_DIR}")
    if code_commit:
        config["process"]["env"].append(f"EDGE_CODE_COMMIT={code_commit}")


def host_dirs(config: dict) -> dict[str, str]:
    """The host directories besides the socket's that ``config`` binds read-write: ``metrics_dir``
    and ``state_dir`` (edge/system/socket_dir.py ``prepare_host_dirs`` makes them the runtime's)."""
    keys = {CONTAINER_METRICS_DIR: "metrics_dir", STATE_DIR: "state_dir"}
    return {keys[m["destination"]]: m["source"] for m in config.get("mounts", []) if m["destination"] in keys}


def runtime_config(*, args: list[str], env: dict[str, str], uid: int, gid: int, socket_dir_host: str,
                   arch: str, memory_bytes: int, pids: int = PIDS_LIMIT, nofile: int = NOFILE,
                   share_host_network: bool = False, hostname: str = "edge",
                   state_dir_host: str = STATE_DIR, code_commit: str | None = None) -> dict:
    """The config.json dict (before CDI edits are merged); ``memory_bytes`` from :func:`memory_limit`."""
    namespaces = [{"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup")]  # cgroup: sees only its own
    if not share_host_network:
        namespaces.append({"type": "network"})  # loopback only: ipc:// needs no network
    config = {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(args),
            # The host's socket directory, which the runtime sees at CONTAINER_SOCKET_DIR: its bind
            # error names it (edge/system/socket_dir.py bind_advice), as --bind is not a bundle user's to change.
            "env": [f"{k}={v}" for k, v in env.items()] + [f"EDGE_BUNDLE_SOCKET_DIR={socket_dir_host}"],
            "cwd": "/",
            "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": hostname,
        "mounts": _mounts(socket_dir_host),
        "linux": {
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                # swap = limit: memory+swap may not exceed memory, so no swap (cgroup v2:
                # memory.swap.max 0). A Jetson swaps to zram; swapped weights would stall requests.
                "memory": {"limit": memory_bytes, "swap": memory_bytes},
                "pids": {"limit": pids},
            },
            "namespaces": namespaces,
            "maskedPaths": list(_MASKED),
            "readonlyPaths": list(_READONLY),
            "seccomp": seccomp.profile(arch),
        },
        "annotations": {"org.opencontainers.image.title": "edge", "com.edge.bundle": "1"},
    }
    add_state_dir(config, state_dir_host, code_commit)  # every bundle: its request journal outlives the container
    return config
