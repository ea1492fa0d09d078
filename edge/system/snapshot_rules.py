"""Where a bundle's snapshot lives and when it may be restored: the one rule that the supervisor
(edge-supervise, before each start), ``edge-bundle snapshot`` (image/bundle/snapshot.py) and
``edge doctor`` (edge/commands/doctor/tools.py) apply (docs/snapshot.md).

* :func:`snapshot_dir`: an installed slot's bundle keeps its snapshot outside the slot, keyed by
  its digest (``ROOT/var/cache/edge/<bundle_sha256>/snapshot``); any other beside its real
  directory (``<bundle>.snapshot``).
* :func:`dependencies`: what a snapshot is valid for (the bundle, its path and package, the
  kernel, CRIU, runc, the CPU); ``snapshot.json`` records them when it is taken.
* :func:`check_snapshot`: why a snapshot cannot be restored (None: it can): its format, its
  dependencies, its config.json's paths reachable from the user namespace, its image files at
  their recorded sizes.

The formats it shares with the runtime's side (edge/runtime/snapshot.py): ``MARKER``, ``RESUME``.
Standard library only: the supervisor runs on the host's bare python3 (Python 3.8 on a Jetson).
"""

import json
import os
import platform
import stat
import subprocess

__all__ = ["SNAPSHOT_FORMAT", "MARKER", "RESUME", "USERNS_BASE", "USERNS_SIZE", "CRIU_CONF", "CRIU_CONF_OK",
           "snapshot_dir", "dependencies", "check_snapshot", "unreachable_in_userns", "id_map", "as_snapshot_config",
           "site_criu_conf",
           "tool_version", "cpu_model"]

METADATA = "edge-bundle.json"
SNAPSHOT_FORMAT = 1
MARKER = "snapshot-point.json"  # the runtime writes it when it waits at its snapshot point
RESUME = "snapshot-resume.json"  # the restorer writes it before SIGUSR2
USERNS_BASE = 100000  # host ids of the snapshot container's other ids
USERNS_SIZE = 65536
# CRIU options for the checkpoint, through runc's org.criu.config annotation. The container's
# network namespace holds loopback only and the runtime has no socket open at its snapshot
# point, so there is nothing to lock; the iptables lock was 100 of a restore's 215 ms here.
# Only a CRIU that takes network-lock in an RPC configuration file (image/criu/build.sh's
# build, GitID v4.1.1-edge1; 4.1.1 itself dereferences NULL there) gets it.
CRIU_CONF = "network-lock skip\n"
CRIU_CONF_OK = "v4.1.1-edge1"


def snapshot_dir(bundle):
    """Where the bundle's snapshot lives: for an installed slot's bundle (its real directory
    ``ROOT/opt/edge/slots/<a|b>/bundle``, beside the slot's edge-archive.json), outside the slot, keyed by the digest in its edge-bundle.json:
    ``ROOT/var/cache/edge/<bundle_sha256>/snapshot`` (a slot holds only what its manifest lists, and
    filling it again with the same bundle finds the snapshot). Otherwise ``<bundle>.snapshot`` beside
    the bundle's real directory (``current`` -> ``v3``: ``v3.snapshot``)."""
    real = os.path.realpath(bundle)
    slot = os.path.dirname(real)
    parts = slot.split(os.sep)
    if (os.path.basename(real) == "bundle" and parts[-1] in ("a", "b") and parts[-4:-1] == ["opt", "edge", "slots"]
            and os.path.isfile(os.path.join(slot, "edge-archive.json"))):
        sha = _bundle_sha256(real)
        if sha is not None:
            return os.path.join(os.sep.join(parts[:-4]) or os.sep, "var", "cache", "edge", sha, "snapshot")
    return real + ".snapshot"


def _bundle_sha256(bundle):
    """The bundle's digest from its edge-bundle.json when it is one (64 lowercase hex digits: it
    names a directory), else None."""
    try:
        with open(os.path.join(bundle, METADATA)) as f:
            sha = json.load(f).get("bundle_sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return sha if isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha) else None


def id_map(keep):
    """A snapshot container's user namespace: container ids onto host ids, ``keep`` (the runtime's
    uid or gid: its socket is owned as in a fresh start) to itself, the rest of 0..65535 above
    USERNS_BASE. CRIU must read the runtime's limits, which takes CAP_SYS_RESOURCE; root has every
    capability in a namespace it owns."""
    return [{"containerID": 0, "hostID": USERNS_BASE, "size": keep},
            {"containerID": keep, "hostID": keep, "size": 1},
            {"containerID": keep + 1, "hostID": USERNS_BASE + keep + 1, "size": USERNS_SIZE - keep - 1}]


def as_snapshot_config(config):
    """``config`` (a bundle's config.json, its paths made absolute) changed into the one a snapshot
    is taken and restored with: the runtime waits at its snapshot point (``--snapshot-point``), in
    a user namespace of :func:`id_map`'s ids. Changed in place, and returned."""
    process = config["process"]
    process["args"] = [*process["args"], "--snapshot-point"]
    linux = config["linux"]
    if not any(ns["type"] == "user" for ns in linux["namespaces"]):
        linux["namespaces"].append({"type": "user"})
    linux["uidMappings"] = id_map(process["user"]["uid"])
    linux["gidMappings"] = id_map(process["user"]["gid"])
    return config


def site_criu_conf():
    """/etc/criu/runc.conf, which runc gives CRIU unless an annotation names another file: the
    checkpoint's names its own (CRIU_CONF), so the site's options are carried into it."""
    try:
        with open("/etc/criu/runc.conf") as f:
            text = f.read()
    except OSError:
        return ""
    return text if text.endswith("\n") or not text else text + "\n"


def tool_version(cmd):
    """A tool's ``--version`` output, its lines joined by "; " (how a snapshot records runc and CRIU);
    "absent" when it cannot be run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "absent"
    return "; ".join(line.strip() for line in out.splitlines() if line.strip()) or "absent"


def cpu_model():
    """The CPU's model name (aarch64: its ``Model`` or ``CPU part``), else the machine's architecture."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(("model name", "Model", "CPU part")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def dependencies(bundle, meta, runc, criu="criu"):
    """What a snapshot is valid for; a restore is tried only when all of these are equal. The bundle's
    real path too: the snapshot's config.json names its rootfs and binds by it, so a snapshot cached
    by digest and taken in one slot is stale for the same bundle in the other."""
    package = meta.get("package", {})
    return {"bundle_sha256": meta.get("bundle_sha256"), "bundle_path": os.path.realpath(bundle),
            "package_sha256": package.get("package_sha256"), "model_sha256": package.get("model_sha256"),
            "tokenizer_sha256": package.get("tokenizer_sha256"), "kernel": platform.release(),
            "criu": tool_version([criu, "--version"]), "runc": tool_version([runc, "--version"]), "cpu": cpu_model()}


def check_snapshot(snap, deps):
    """Why the snapshot at ``snap`` cannot be restored (None: it can)."""
    try:
        with open(os.path.join(snap, "snapshot.json")) as f:
            record = json.load(f)
    except FileNotFoundError:
        return f"no snapshot in {snap}"
    except (OSError, ValueError) as exc:
        return f"{snap}/snapshot.json is unreadable ({exc})"
    if not isinstance(record, dict) or record.get("format") != SNAPSHOT_FORMAT:
        return f"snapshot format {record.get('format') if isinstance(record, dict) else None!r}, " \
               f"this supervisor reads {SNAPSHOT_FORMAT}"
    recorded = record.get("dependencies") if isinstance(record.get("dependencies"), dict) else {}
    changed = [f"{k}: {recorded.get(k)!r} -> {v!r}" for k, v in deps.items() if recorded.get(k) != v]
    if changed:
        return "taken for another " + "; ".join(changed)
    images = record.get("images")
    try:
        with open(os.path.join(snap, "config.json")) as f:
            blocked = unreachable_in_userns(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{snap}/config.json is unreadable ({exc})"
    if blocked:
        return blocked
    if not isinstance(images, dict) or not images:
        return "no image files listed (a partial snapshot)"
    for name, size in images.items():
        path = os.path.join(snap, "images", os.path.basename(name))
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            return f"image file {name} is missing or not {size} bytes (truncated or partial snapshot)"
    return None


def unreachable_in_userns(config):
    """Why CRIU cannot restore ``config``'s mounts, or None. It bind-mounts their sources from
    inside the user namespace, as its root (host uid USERNS_BASE, no capability on the host's
    files), so every directory above a source, and above the rootfs, must be searchable by others
    (``/run`` is; pytest's ``/tmp/pytest-of-root``, 0700, is not: "open_tree ... Permission denied")."""
    paths = [config["root"]["path"]] + [m["source"] for m in config.get("mounts", []) if m.get("type") == "bind"]
    for path in paths:
        parent = os.path.dirname(os.path.abspath(path))
        while True:
            try:
                mode = os.stat(parent).st_mode
            except OSError as exc:
                return f"{parent}: {exc.strerror}"
            if not mode & stat.S_IXOTH:
                return (f"{parent} (mode {stat.S_IMODE(mode):04o}, above {path}) is not searchable by the snapshot's "
                        f"user namespace (host uid {USERNS_BASE}): chmod o+x it, or move the bundle's socket directory")
            if parent == "/":
                break
            parent = os.path.dirname(parent)
    return None
